//! Whether two written names are the same name written two ways: word
//! for word, by a shared long word, or one inside the other.

/// Whether two names share a word of three or more letters (case
/// ignored): "D. Whitcombe" and "Dana Whitcombe" do, "Priya Raman" and
/// "Dana Whitcombe" do not.
/// Cue `shared_long_word`.
pub(crate) fn shares_a_word(a: &str, b: &str) -> bool {
    let long = |s: &str| -> Vec<String> {
        crate::text::words(s)
            .filter(|w| w.chars().count() >= 3)
            .map(str::to_lowercase)
            .collect()
    };
    let theirs = long(b);
    long(a).iter().any(|w| theirs.contains(w))
}

/// Whether a record's value (normalised) writes a mention's name
/// (normalised): the same words, or the name's words within the value's
/// ("Acme Corp" in "Acme Corp (UK)"), or the value's within the name's
/// when the value is not a short code ("Northwind Outfitters" for
/// "Northwind Outfitters Inc").
/// Cue `record_writes_name`.
pub(crate) fn writes(value: &str, name: &str) -> bool {
    let within = |outer: &str, inner: &str| {
        !inner.is_empty()
            && (outer == inner
                || outer.starts_with(&format!("{inner} "))
                || outer.ends_with(&format!(" {inner}"))
                || outer.contains(&format!(" {inner} ")))
    };
    within(value, name) || (value.len() >= 4 && within(name, value))
}
