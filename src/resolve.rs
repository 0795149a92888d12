//! Resolution: deciding which mentions are the same node. So far this holds
//! the name normalisation that every matching step shares; the DataFusion
//! resolution plans build on it.

/// Normalises a name for matching: lower case, every run of characters
/// other than letters and digits becomes one space, trimmed. "ACME corp."
/// and "Acme  Corp" both become "acme corp"; "PO-4471" becomes "po 4471".
pub fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut gap = false;
    for c in name.chars() {
        if c.is_alphanumeric() {
            if gap && !out.is_empty() {
                out.push(' ');
            }
            gap = false;
            out.extend(c.to_lowercase());
        } else {
            gap = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::normalize_name;

    #[test]
    fn case_punctuation_and_spacing_do_not_split_a_name() {
        assert_eq!(normalize_name("ACME corp."), "acme corp");
        assert_eq!(normalize_name("  Acme   Corp "), "acme corp");
        assert_eq!(normalize_name("PO-4471"), "po 4471");
    }

    #[test]
    fn different_digits_stay_different() {
        assert_ne!(normalize_name("PO 4471"), normalize_name("PO 4417"));
    }

    #[test]
    fn non_ascii_letters_are_kept() {
        assert_eq!(normalize_name("Müller GmbH"), "müller gmbh");
    }
}
