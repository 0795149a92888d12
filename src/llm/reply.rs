//! Turning what a model wrote into a typed value: the JSON schema sent with
//! the request, and the clean-up a reply gets before it is parsed.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

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
}
