//! Field labels offered as names: "Subscription" in "… Customer:
//! Northwind. Subscription: Quillfeather Planner".

use super::words::Written;
use crate::text::words;

/// Whether `text` writes `name`, one word, only as a field label: every
/// occurrence opens a sentence, is followed by a colon and has other text
/// before it on its line ("… ORDER FORM QF-0087. Customer: Northwind.
/// Subscription: Quillfeather Planner"). A name that opens its line
/// ("Nadia: …", "- Fares: Tomás") may be a speaker or a list item, one
/// inside a sentence ("Rotation update for Ledger Service: …") is the
/// sentence's subject, and a name of several words or with a digit ("SEV-
/// 11: …", a ticket code before its title) is a name: none of them count.
pub fn only_a_label(name: &str, written: &Written<'_>) -> bool {
    let wanted: Vec<String> = words(name).map(str::to_lowercase).collect();
    if wanted.len() != 1 || name.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let text = written.text;
    let mut labels = 0;
    for window in written.occurrences(&wanted) {
        let (first, last) = (&window[0], &window[window.len() - 1]);
        let end = last.at + last.text.len();
        let line = text[..first.at].rsplit('\n').next().unwrap_or_default();
        let opens_line = line
            .trim_matches(|c: char| c.is_whitespace() || "-*•>#".contains(c))
            .is_empty();
        if !text[end..].starts_with(':') || opens_line || !first.opens {
            return false;
        }
        labels += 1;
    }
    labels > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`only_a_label`] over a text given as a string.
    fn label(name: &str, text: &str) -> bool {
        only_a_label(name, &Written::new(text))
    }

    #[test]
    fn a_name_written_only_before_a_colon_mid_line_is_a_field_label() {
        let form = "ORDER FORM QF-0087. Customer: Northwind Outfitters. Subscription: \
                    Quillfeather Planner, Team edition.\nOwner: Maya\n- Harbour Gateway: Tomás";
        assert!(label("Subscription", form));
        assert!(label("customer", form));
        // Opening a line: a speaker, a heading or a list item.
        assert!(!label("Owner", form));
        assert!(!label("Harbour Gateway", form));
        assert!(!label(
            "Ledger",
            "Maya: Rotation update for Ledger: Sofia is off it."
        ));
        // Written without a colon, or not written at all.
        assert!(!label("Quillfeather Planner", form));
        assert!(!label("Relaywave", form));
        let chat = "Nadia Fairweather: INC-2077: SMS confirmations are late. Status: open.";
        assert!(!label("INC-2077", chat), "a code before its title");
        assert!(label("Status", chat));
    }
}
