//! Turning what a model wrote into a typed value: the JSON schema sent with
//! the request, and the clean-up a reply gets before it is parsed.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// The JSON schema of `T` in the strict form OpenAI's structured outputs
/// require (every property required, no additional properties) and that
/// llama.cpp's grammar conversion understands.
pub fn schema_for<T: JsonSchema>() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null);
    strictify(&mut schema);
    if let Value::Object(map) = &mut schema {
        map.remove("$schema");
        map.remove("title");
    }
    schema
}

fn strictify(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let is_object = map.get("type").is_some_and(|t| t == "object")
                || (map.contains_key("properties") && !map.contains_key("type"));
            if is_object {
                let keys: Vec<Value> = map
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().map(Value::String).collect())
                    .unwrap_or_default();
                map.insert("required".into(), Value::Array(keys));
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            // Formats such as "uint32" are not part of strict mode.
            if map.get("format").is_some_and(|f| {
                f.as_str().is_some_and(|f| {
                    f.starts_with("uint") || f.starts_with("int") || f == "double" || f == "float"
                })
            }) {
                map.remove("format");
            }
            map.remove("minimum");
            for v in map.values_mut() {
                strictify(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strictify),
        _ => {}
    }
}

/// Removes what models wrap JSON in: `<think>…</think>` reasoning blocks,
/// Markdown code fences and prose before or after the JSON value.
pub fn clean(content: &str) -> &str {
    let mut text = content.trim();
    // Reasoning models put their thoughts first; an unclosed block means the
    // reply is all thoughts.
    while let Some(start) = text.find("<think>") {
        match text[start..].find("</think>") {
            Some(end) => text = text[start + end + "</think>".len()..].trim(),
            None => return "",
        }
    }
    if let Some(rest) = text.strip_prefix("```") {
        let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
        text = rest.trim();
        if let Some(end) = text.rfind("```") {
            text = text[..end].trim();
        }
    }
    let start = text.find(['{', '[']);
    let end = text.rfind(['}', ']']);
    match (start, end) {
        (Some(s), Some(e)) if e >= s => &text[s..=e],
        _ => text,
    }
}

/// Parses a cleaned reply into `T`; the error says what did not match, in
/// words that can be fed back to the model.
pub fn parse<T: DeserializeOwned>(content: &str) -> Result<T, String> {
    let cleaned = clean(content);
    if cleaned.is_empty() {
        return Err("the reply holds no JSON".into());
    }
    serde_json::from_str(cleaned).map_err(|e| e.to_string())
}

/// Parses a cleaned reply into `T` within the bounds of `schema`
/// (`maxItems`, `maxLength`, `minimum`, `maximum`): a server that ignores
/// them (no grammar, or an old one) must not get a runaway answer past the
/// parser. The reply degrades item by item: an array element that breaks
/// a bound is dropped, an array past `maxItems` is cut there, and each
/// drop is described in the returned notes (for the caller's `failures`
/// rows). Only a bound broken outside any array refuses the whole reply.
/// Enums are left to the caller, which rejects such items with a reason.
pub fn parse_within<T: DeserializeOwned>(
    content: &str,
    schema: &Value,
) -> Result<(T, Vec<String>), String> {
    let cleaned = clean(content);
    if cleaned.is_empty() {
        return Err("the reply holds no JSON".into());
    }
    let mut value: Value = serde_json::from_str(cleaned).map_err(|e| e.to_string())?;
    let mut notes = Vec::new();
    prune(&mut value, schema, schema, "reply", &mut notes)?;
    let parsed = serde_json::from_value(value).map_err(|e| e.to_string())?;
    Ok((parsed, notes))
}

/// Parses a reply that was cut at `max_tokens` (see [`salvage`]) within
/// `schema`: the elements it completed are kept, with a note saying what
/// the cut cost. `Err` when it completed no element at all.
pub fn parse_cut<T: DeserializeOwned>(
    content: &str,
    schema: &Value,
) -> Result<(T, Vec<String>), String> {
    let (text, kept) = salvage(content).ok_or("the reply was cut before it completed any item")?;
    let (value, mut notes) = parse_within(&text, schema)?;
    let mut watch = RepeatWatch::default();
    notes.push(if watch.feed(content) {
        format!(
            "the reply was stopped when it began to repeat its items ({} repeated word for word); the {kept} item(s) it completed are kept",
            watch.repeats()
        )
    } else {
        format!(
            "the reply was cut at its max_tokens bound; the {kept} item(s) it completed are kept and the one it was writing is lost"
        )
    });
    Ok((value, notes))
}

/// Items of one list a streamed reply may repeat word for word before it
/// is stopped ([`RepeatWatch`]). Two, not one: a model sometimes writes
/// one item twice and goes on with new ones.
pub const REPEATS_TO_STOP: usize = 2;

/// Watches a reply as it streams in for a model caught in a loop: small
/// models at temperature 0 sometimes write the same few items over and
/// over until `max_tokens` (12 facts of which 1 distinct, 1,000 tokens).
/// Measured on the example corpora, such replies were a tenth of the calls
/// and over a fifth of all completion tokens. The watch reads the elements
/// of each list in the reply's outer value (as [`salvage`] does), without
/// the whitespace outside strings, and says to stop once
/// [`REPEATS_TO_STOP`] of them have repeated an earlier element of their
/// list. It knows JSON, not prompts.
#[derive(Debug, Default)]
pub struct RepeatWatch {
    /// Bytes of the reply read so far.
    read: usize,
    scan: JsonBytes,
    /// The element being read, when one is.
    item: Option<Vec<u8>>,
    /// The elements of the list being read.
    items: std::collections::HashSet<Vec<u8>>,
    repeats: usize,
}

impl RepeatWatch {
    /// Reads `content`, the reply so far (each call with all of it: only
    /// what is new is read), and says whether the reply should be stopped.
    pub fn feed(&mut self, content: &str) -> bool {
        let new = content.as_bytes().get(self.read..).unwrap_or_default();
        self.read = content.len();
        for &b in new {
            let in_list = self.scan.in_outer_list();
            match self.scan.step(b) {
                Byte::Space => continue,
                Byte::Open if b == b'[' && self.scan.lists() == 1 => {
                    // A new outer list: its elements are compared among
                    // themselves (`{"facts": {"Dana": […], "Acme": […]}}`).
                    self.items.clear();
                    continue;
                }
                Byte::Open if in_list => self.item = Some(Vec::new()),
                Byte::Close if self.scan.in_outer_list() => {
                    if let Some(mut item) = self.item.take() {
                        item.push(b);
                        if !self.items.insert(item) {
                            self.repeats += 1;
                        }
                    }
                    continue;
                }
                _ => {}
            }
            if let Some(item) = &mut self.item {
                item.push(b);
            }
        }
        self.repeats >= REPEATS_TO_STOP
    }

    /// Elements read so far that repeated an earlier one of their list.
    pub fn repeats(&self) -> usize {
        self.repeats
    }
}

/// What a byte of a JSON text is, read one byte at a time by [`JsonBytes`].
#[derive(Debug, PartialEq)]
enum Byte {
    /// Inside a string, its quotes included.
    Text,
    /// Whitespace outside strings.
    Space,
    /// `{` or `[`.
    Open,
    /// `}` or `]`.
    Close,
    /// Anything else: `:`, `,`, numbers, literals.
    Other,
}

/// The state of a JSON text read one byte at a time: the open brackets
/// and whether a string is open. Enough to find the elements of the
/// reply's outer lists ([`salvage`], [`RepeatWatch`]) in a text that may
/// stop anywhere.
#[derive(Debug, Default)]
struct JsonBytes {
    stack: Vec<u8>,
    in_string: bool,
    escaped: bool,
}

impl JsonBytes {
    fn step(&mut self, b: u8) -> Byte {
        if self.in_string {
            match (self.escaped, b) {
                (true, _) => self.escaped = false,
                (false, b'\\') => self.escaped = true,
                (false, b'"') => self.in_string = false,
                _ => {}
            }
            return Byte::Text;
        }
        match b {
            b'"' => {
                self.in_string = true;
                Byte::Text
            }
            b'{' | b'[' => {
                self.stack.push(b);
                Byte::Open
            }
            b'}' | b']' => {
                self.stack.pop();
                Byte::Close
            }
            b if b.is_ascii_whitespace() => Byte::Space,
            _ => Byte::Other,
        }
    }

    /// Lists open.
    fn lists(&self) -> usize {
        self.stack.iter().filter(|&&b| b == b'[').count()
    }

    /// Whether the innermost open bracket is an outer list: the one list
    /// open, not one nested in an element.
    fn in_outer_list(&self) -> bool {
        self.stack.last() == Some(&b'[') && self.lists() == 1
    }
}

/// The JSON a reply cut mid-way holds in full: its text up to the last
/// element it completed in its outer array (`[…]`, `{"items": […]}`, or
/// one list of several, `{"facts": {"Dana": […], …}}`), with the open
/// brackets closed, and how many such elements there are. A reply with no
/// list at all, an object keyed by item (`{"1": "OWNS", "2": …}`), keeps
/// the members it completed instead. `None` when no element (or member)
/// was completed. One runaway item (a value copied from the whole
/// episode) then costs only itself, not the items written before it.
pub fn salvage(content: &str) -> Option<(String, usize)> {
    let start = content.find(['{', '['])?;
    let text = &content[start..];
    let mut scan = JsonBytes::default();
    let mut last: Option<(usize, Vec<u8>)> = None;
    let mut kept = 0;
    // Members of a keyed object: each ends at a comma between members.
    let (mut members, mut member_end, mut has_list) = (0, None, false);
    for (i, b) in text.bytes().enumerate() {
        let step = scan.step(b);
        has_list |= step == Byte::Open && b == b'[';
        if step == Byte::Close && scan.in_outer_list() {
            // An element just ended inside an outer list.
            kept += 1;
            last = Some((i + 1, scan.stack.clone()));
        } else if step == Byte::Other && b == b',' && scan.stack == [b'{'] {
            members += 1;
            member_end = Some(i);
        }
    }
    if last.is_none() && !has_list {
        let end = member_end?;
        return Some((format!("{}}}", &text[..end]), members));
    }
    let (end, open) = last?;
    let mut out = text[..end].to_string();
    for b in open.iter().rev() {
        out.push(if *b == b'[' { ']' } else { '}' });
    }
    Some((out, kept))
}

/// Enforces the bounds of `schema` on `value` (see [`parse_within`]);
/// `Err` says how `value` itself breaks one. `root` resolves local `$ref`s;
/// anything the check does not know passes (deserialisation judges the
/// shape).
fn prune(
    value: &mut Value,
    schema: &Value,
    root: &Value,
    at: &str,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return Ok(());
    };
    if let Some(target) = s.get("$ref").and_then(Value::as_str) {
        let resolved = target
            .strip_prefix("#/")
            .map(|p| p.split('/').fold(root, |v, k| &v[k]));
        return match resolved {
            Some(next) if !next.is_null() => prune(value, next, root, at, notes),
            _ => Ok(()),
        };
    }
    if let Some(branches) = s.get("anyOf").and_then(Value::as_array)
        && !branches.is_empty()
    {
        let mut first = None;
        for b in branches {
            // The branch of the value's type; other type mismatches are
            // left to deserialisation, which refuses the reply as before.
            if let Some(kind) = b.get("type")
                && !has_type(value, kind)
            {
                first.get_or_insert_with(|| format!("{at} is not of type {kind}"));
                continue;
            }
            let (mut candidate, mut more) = (value.clone(), Vec::new());
            match prune(&mut candidate, b, root, at, &mut more) {
                Ok(()) => {
                    *value = candidate;
                    notes.extend(more);
                    return Ok(());
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        return Err(first.unwrap_or_default());
    }
    let bound = |key: &str| s.get(key).and_then(Value::as_f64);
    match value {
        Value::String(text) => {
            let n = text.chars().count();
            if let Some(max) = bound("maxLength").filter(|&m| n as f64 > m) {
                return Err(format!("{at} has {n} characters, more than {max} allowed"));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            let (lo, hi) = (bound("minimum"), bound("maximum"));
            if lo.is_some_and(|m| x < m) || hi.is_some_and(|m| x > m) {
                let shown = |b: Option<f64>| b.map_or(String::new(), |m| m.to_string());
                return Err(format!(
                    "{at} is {n}, outside {}..={}",
                    shown(lo),
                    shown(hi)
                ));
            }
        }
        Value::Array(items) => {
            if let Some(max) = bound("maxItems").filter(|&m| items.len() as f64 > m) {
                // One note per item cut, so that each ends in a row.
                let n = items.len();
                notes.extend(
                    (max as usize..n).map(|i| format!("{at}[{i}] dropped: past maxItems ({max})")),
                );
                items.truncate(max as usize);
            }
            if let Some(item) = s.get("items") {
                let mut i = 0;
                items.retain_mut(|v| {
                    let at = format!("{at}[{i}]");
                    i += 1;
                    keep_item(v, item, root, &at, notes)
                });
            }
        }
        Value::Object(map) => {
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                if keyed_collection(s, props) {
                    // A member that breaks its schema is dropped, as an
                    // element of a list is: the others keep their answers.
                    map.retain(|k, v| match props.get(k) {
                        Some(p) => keep_item(v, p, root, &format!("{at}.{k}"), notes),
                        None => true,
                    });
                } else {
                    for (k, v) in map.iter_mut() {
                        if let Some(p) = props.get(k) {
                            prune(v, p, root, &format!("{at}.{k}"), notes)?;
                        }
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// Prunes one item of a collection (a list element or a keyed member)
/// and says whether to keep it: an item that breaks its schema is
/// dropped with a note, so the other items keep their answers.
fn keep_item(
    v: &mut Value,
    schema: &Value,
    root: &Value,
    at: &str,
    notes: &mut Vec<String>,
) -> bool {
    match prune(v, schema, root, at, notes) {
        Ok(()) => true,
        Err(e) => {
            notes.push(format!("{at} dropped: {e}"));
            false
        }
    }
}

/// Whether an object schema describes a collection keyed by name rather
/// than a record: two or more properties, all required, all of one
/// schema (a walk reply keyed by item number, `{"1": …, "2": …}`). Its
/// members are items, each answered or not on its own.
fn keyed_collection(schema: &Map<String, Value>, props: &Map<String, Value>) -> bool {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut shapes = props.values();
    let first = shapes.next();
    props.len() >= 2
        && required.len() == props.len()
        && props.keys().all(|k| required.contains(&k.as_str()))
        && shapes.all(|p| Some(p) == first)
}

/// The notes of [`parse_within`] in one line for a failure reason: the
/// first three, then how many more.
pub fn describe_dropped(notes: &[String]) -> String {
    let mut text = notes.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if notes.len() > 3 {
        text.push_str(&format!("; and {} more", notes.len() - 3));
    }
    text
}

/// Whether `value` is of the JSON schema `type` (a name or a list of names).
fn has_type(value: &Value, kind: &Value) -> bool {
    let is = |name: &str| match name {
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => true,
    };
    match kind {
        Value::String(name) => is(name),
        Value::Array(names) => names.iter().filter_map(Value::as_str).any(is),
        _ => true,
    }
}

/// The first `n` characters of a reply, for failure rows.
///
/// Runs of whitespace become one space, so that pretty-printed JSON reads
/// on one line in messages and tables.
pub fn excerpt(content: &str, n: usize) -> String {
    let flat = content.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut s: String = flat.chars().take(n).collect();
    if flat.chars().count() > n {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn items_past_a_schema_bound_are_dropped_with_a_note_and_the_rest_parse() {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "label": {"type": "string", "maxLength": 8},
                "items": {
                    "type": "array",
                    "maxItems": 3,
                    "items": {"$ref": "#/$defs/Item"}
                }
            },
            "$defs": {"Item": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 3},
                    "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]}
                }
            }}
        });
        let ok =
            r#"{"label": "x", "items": [{"id": 1, "note": "short"}, {"id": 2, "note": null}]}"#;
        let (v, notes): (Value, _) = parse_within(ok, &schema).expect("within bounds");
        assert_eq!(v["items"].as_array().map(Vec::len), Some(2));
        assert!(notes.is_empty(), "{notes:?}");
        let mixed = r#"{"label": "x", "items": [
            {"id": 9}, {"id": 1, "note": "far too long"}, {"id": 2}, {"id": 3}, {"id": 3}]}"#;
        let (v, notes): (Value, _) = parse_within(mixed, &schema).expect("degrades");
        // Cut to 3, then the two bad ones dropped: only {"id": 2} is left.
        assert_eq!(v["items"], serde_json::json!([{"id": 2}]));
        assert_eq!(notes.len(), 4, "{notes:?}");
        assert!(
            notes[0].contains("reply.items[3] dropped: past maxItems (3)"),
            "{notes:?}"
        );
        assert!(notes[1].contains("reply.items[4] dropped"), "{notes:?}");
        assert!(notes[2].contains("reply.items[0].id is 9"), "{notes:?}");
        assert!(notes[3].contains("12 characters, more than 5"), "{notes:?}");
        // A bound outside any array refuses the reply.
        let err = parse_within::<Value>(r#"{"label": "much too long", "items": []}"#, &schema)
            .expect_err("label too long");
        assert!(err.contains("reply.label has 13 characters"), "{err}");
    }

    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, JsonSchema, PartialEq)]
    struct Entity {
        name: String,
        kind: Option<String>,
        count: u32,
    }

    #[derive(Debug, Deserialize, JsonSchema, PartialEq)]
    struct Reply {
        entities: Vec<Entity>,
    }

    #[test]
    fn schemas_are_strict_objects_with_every_property_required() {
        let schema = schema_for::<Reply>();
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema["required"], serde_json::json!(["entities"]));
        let entity = &schema["$defs"]["Entity"];
        assert_eq!(entity["additionalProperties"], false);
        assert_eq!(
            entity["required"],
            serde_json::json!(["name", "kind", "count"])
        );
        let text = schema.to_string();
        assert!(
            !text.contains("uint32") && !text.contains("minimum"),
            "{text}"
        );
    }

    #[test]
    fn think_blocks_fences_and_prose_are_removed() {
        let want = Reply {
            entities: vec![Entity {
                name: "Acme".into(),
                kind: None,
                count: 2,
            }],
        };
        let body = r#"{"entities":[{"name":"Acme","kind":null,"count":2}]}"#;
        for wrapped in [
            body.to_string(),
            format!("<think>the user wants JSON</think>\n{body}"),
            format!("```json\n{body}\n```"),
            format!("Here is the JSON:\n{body}\nHope this helps."),
            format!("<think>a</think><think>b</think>```\n{body}\n```"),
        ] {
            assert_eq!(parse::<Reply>(&wrapped).as_ref(), Ok(&want), "{wrapped}");
        }
    }

    #[test]
    fn unusable_replies_say_why() {
        assert_eq!(
            parse::<Reply>("<think>still thinking").unwrap_err(),
            "the reply holds no JSON"
        );
        let err = parse::<Reply>(r#"{"entities":[{"name":"Acme"}]}"#).unwrap_err();
        assert!(err.contains("missing field"), "{err}");
        let err = parse::<Reply>(r#"{"entities": [{"name": "Ac"#).unwrap_err();
        assert!(err.contains("EOF"), "{err}");
        assert_eq!(excerpt("abcdef", 3), "abc…");
        assert_eq!(excerpt("{\n  \"a\": 1\n}", 40), "{ \"a\": 1 }");
    }

    #[test]
    fn a_cut_reply_keeps_the_items_it_completed() {
        // Cut inside the third item's string, with a brace and an escaped
        // quote in the strings before it.
        let cut = "```json\n{\n  \"entities\": [\n    {\"name\": \"A {x}\", \"kind\": null, \"count\": 1},\n    {\"name\": \"B \\\"b\\\"\", \"kind\": \"t\", \"count\": 2},\n    {\"name\": \"runaway text that goes on and o";
        let (text, kept) = salvage(cut).expect("two items are complete");
        assert_eq!(kept, 2);
        let (reply, notes) = parse_cut::<Reply>(cut, &serde_json::json!({})).expect("parses");
        let names: Vec<&str> = reply.entities.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["A {x}", "B \"b\""], "{text}");
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("2 item(s)"), "{notes:?}");
        // A bare array at the top, cut inside an element.
        assert_eq!(
            salvage(r#"[{"a": [1, 2]}, {"a": [3"#),
            Some((r#"[{"a": [1, 2]}]"#.to_string(), 1))
        );
        // Lists grouped under keys: the last one is cut, the others kept.
        assert_eq!(
            salvage(r#"{"facts": {"A": [{"t": 1}], "B": [{"t": 2}, {"t": "#),
            Some((
                r#"{"facts": {"A": [{"t": 1}], "B": [{"t": 2}]}}"#.to_string(),
                2
            ))
        );
        // An object keyed by item (a walk reply): the members before the
        // last comma are kept, a comma inside a string or a nested object
        // ends none.
        assert_eq!(
            salvage(r#"{"1": "A, B", "2": {"subtype": "C", "x": "y"}, "3": "D"#),
            Some((
                r#"{"1": "A, B", "2": {"subtype": "C", "x": "y"}}"#.to_string(),
                2
            ))
        );
        assert_eq!(salvage(r#"{"1": "OWN"#), None);
        // Nothing completed: nothing to keep.
        assert_eq!(salvage(r#"{"entities": [{"name": "Ac"#), None);
        // A scalar member before a list whose first element is cut is no
        // item: the items are the list's.
        assert_eq!(salvage(r#"{"label": "x", "items": [{"id": 1"#), None);
        assert!(parse_cut::<Reply>(r#"{"entities": [{"na"#, &serde_json::json!({})).is_err());
    }

    #[test]
    fn a_reply_that_loops_is_stopped_at_its_second_repeat_and_keeps_its_distinct_items() {
        let fact = |n: u32| {
            format!(
                r#"{{"source": "Dana", "target": "Acme {n}", "fact": "Dana signed {{x}}, \"ok\"."}}"#
            )
        };
        // Pretty-printed or not, the same element is the same element.
        let looping = format!(
            "{{\"facts\": [\n  {},\n  {},\n{},{}, {}",
            fact(1),
            fact(2),
            fact(1).replace(r#"", ""#, "\",\n    \""),
            fact(2),
            fact(3)
        );
        let mut watch = RepeatWatch::default();
        // Fed as it streams in, a few bytes at a time.
        let mut stopped_at = None;
        for end in (1..=looping.len()).filter(|&i| looping.is_char_boundary(i)) {
            if watch.feed(&looping[..end]) {
                stopped_at = Some(end);
                break;
            }
        }
        let end = stopped_at.expect("two repeats stop the reply");
        assert_eq!(watch.repeats(), REPEATS_TO_STOP);
        assert!(
            looping[..end].ends_with(&fact(2)),
            "stops right after the second repeat"
        );
        // What was read up to there is kept, with a note that says why.
        let (value, notes): (Value, _) =
            parse_cut(&looping[..end], &serde_json::json!({})).expect("salvaged");
        assert_eq!(value["facts"].as_array().map(Vec::len), Some(4));
        assert!(
            notes[0].contains("began to repeat its items (2 repeated"),
            "{notes:?}"
        );

        // One repeat is not a loop; different lists, nested lists and
        // strings that hold brackets are not repeats.
        let mut watch = RepeatWatch::default();
        let fine = r#"{"facts": {"Dana": [{"t": "A"}, {"t": "A"}, {"t": "B ]} [{"}],
                       "Bob": [{"t": "A"}, {"t": "B"}, {"t": "[{"t": "A"}]"}]}}"#;
        assert!(!watch.feed(fine));
        assert_eq!(watch.repeats(), 1);
        let mut watch = RepeatWatch::default();
        assert!(!watch.feed(r#"{"items": [{"id": 1, "tags": [{"a": 1}, {"a": 1}, {"a": 1}]}]}"#));
        assert_eq!(watch.repeats(), 0);
    }
}
