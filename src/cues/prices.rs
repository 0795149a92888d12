//! Money amounts and counts a model writes around a name: "20 Ridgeback
//! 14 laptops (USD 27,400.00)".

/// Currency signs and codes an amount is written with.
pub(super) const CURRENCIES: [&str; 12] = [
    "$", "€", "£", "¥", "usd", "eur", "gbp", "jpy", "chf", "dollars", "euros", "pounds",
];

/// A name without the count a model wrote in front of it: "12 Ridgeback
/// 14 laptops" is twelve of "Ridgeback 14 laptops". Only a bare number
/// before a name that holds a capitalised word and ends in a plural
/// common noun is a count; "1 World Trade Center", "7 Days Inn", "101
/// Dalmatians" and "20th Century Fox" are names and are kept whole.
pub fn without_count(name: &str) -> &str {
    let trimmed = name.trim();
    let Some((first, rest)) = trimmed.split_once(char::is_whitespace) else {
        return trimmed;
    };
    let rest = rest.trim_start();
    let count = first.starts_with(|c: char| c.is_ascii_digit())
        && first.chars().all(|c| c.is_ascii_digit() || c == ',');
    let words: Vec<&str> = rest.split_whitespace().collect();
    let named = words.iter().any(|w| w.starts_with(char::is_uppercase));
    let plural = words.last().is_some_and(|w| {
        w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") && w.chars().all(char::is_lowercase)
    });
    if count && words.len() >= 2 && named && plural {
        rest
    } else {
        trimmed
    }
}

/// Whether `text` writes a money amount: a currency code or sign next to
/// a number ("USD 27,400.00", "1,200 EUR", "$14.50").
pub(super) fn has_price(text: &str) -> bool {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| "()[]:;,".contains(c)))
        .filter(|w| !w.is_empty())
        .collect();
    let number = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_digit())
            && w.chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
    };
    let currency = |w: &str| CURRENCIES.contains(&w);
    let signs = ['$', '€', '£', '¥'];
    words
        .windows(2)
        .any(|p| (currency(p[0]) && number(p[1])) || (number(p[0]) && currency(p[1])))
        || words
            .iter()
            .any(|w| w.starts_with(signs) && number(w.trim_start_matches(signs)))
}

/// A name without the price a model wrote after it in brackets: "20
/// Ridgeback 14 laptops (USD 27,400.00)" is "20 Ridgeback 14 laptops"
/// (whose count [`without_count`] then takes off). Brackets that hold no
/// money amount stay: "Acme (UK) Ltd".
pub fn without_price(name: &str) -> &str {
    let trimmed = name.trim();
    let Some(open) = trimmed.strip_suffix(')').and_then(|t| t.rfind('(')) else {
        return trimmed;
    };
    let (head, bracket) = trimmed.split_at(open);
    if !head.trim().is_empty() && has_price(bracket) {
        head.trim_end()
    } else {
        trimmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_in_front_of_a_named_product_is_dropped_and_names_led_by_a_number_are_kept() {
        assert_eq!(
            without_count("12 Ridgeback 14 laptops"),
            "Ridgeback 14 laptops"
        );
        assert_eq!(without_count("40 Lumen 27 monitors"), "Lumen 27 monitors");
        assert_eq!(
            without_count(without_price("20 Ridgeback 14 laptops (USD 27,400.00)")),
            "Ridgeback 14 laptops"
        );
        assert_eq!(
            without_price("Planner seats ($1,200 per month)"),
            "Planner seats"
        );
        for name in ["Acme (UK) Ltd", "(USD 5)", "Lumen 27 (2024 model)"] {
            assert_eq!(without_price(name), name, "{name}");
        }
        assert_eq!(
            without_count(" 1,200 Corvid Workspace seats"),
            "Corvid Workspace seats"
        );
        for name in [
            "1 World Trade Center",
            "7 Days Inn",
            "101 Dalmatians",
            "20th Century Fox",
            "40 laptops",
            "3M",
            "24/7 remote help desk",
            "2 Broadway Partners",
        ] {
            assert_eq!(without_count(name), name, "{name}");
        }
    }
}
