//! Yes and no as a model writes them for a boolean property.

/// The truth value a model wrote as a word: "true", "yes" or "y", "false",
/// "no" or "n", case ignored; `None` for any other text.
pub fn yes_or_no(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "yes" | "y" => Some(true),
        "false" | "no" | "n" => Some(false),
        _ => None,
    }
}
