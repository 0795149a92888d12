//! What a name offered as an entity is instead: a date, an amount, a
//! span of time, a quantity, a status, a clause, ….

use super::dates::{DURATION_QUALIFIERS, DURATION_UNITS, RELATIVE_DAYS, is_month};
use super::prices::{CURRENCIES, has_price};

/// Words that lead a descriptive reference ("the order form for …", "our
/// existing agreement with them").
const DETERMINERS: [&str; 12] = [
    "the", "a", "an", "this", "that", "these", "those", "our", "their", "its", "his", "her",
];

/// Words that name a state of something rather than a thing.
const STATUS_WORDS: [&str; 24] = [
    "open",
    "closed",
    "pending",
    "approved",
    "rejected",
    "cancelled",
    "canceled",
    "active",
    "inactive",
    "draft",
    "signed",
    "expired",
    "complete",
    "completed",
    "in progress",
    "on hold",
    "overdue",
    "paid",
    "unpaid",
    "shipped",
    "delivered",
    "resolved",
    "done",
    "new",
];

/// Whether `lower` (a name in lower case) is a severity or priority
/// level as incident and ticket tools write them: "sev-1", "sev 2",
/// "severity 3", "p1", "priority 0". Such a level is a value of a ticket,
/// not an entity.
fn is_severity_level(lower: &str) -> bool {
    let level = ["severity", "priority", "prio", "sev", "p"]
        .iter()
        .find_map(|prefix| lower.strip_prefix(prefix));
    level.is_some_and(|rest| {
        let rest = rest.trim_start_matches([' ', '-']);
        rest.len() == 1 && rest.chars().all(|c| c.is_ascii_digit())
    })
}

/// Whether `text` is one e-mail address and nothing else
/// ("engineering@tidewell.io"; not "Priya <priya@acme.com>").
fn is_email_address(text: &str) -> bool {
    let Some((local, domain)) = text.split_once('@') else {
        return false;
    };
    let local_ok = !local.is_empty()
        && local
            .chars()
            .all(|c| c.is_alphanumeric() || "._%+-".contains(c));
    let labels: Vec<&str> = domain.split('.').collect();
    local_ok
        && labels.len() >= 2
        && labels
            .iter()
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_alphanumeric() || c == '-'))
}

/// What a name offered as an entity is instead, when it is a date, an
/// amount or a price, a span of time, a quantity, a status, an e-mail
/// address, a severity level, a numbered section heading or a clause:
/// "March 1, 2025", "Q3 2025", "$1,200", "USD 14.50 per seat", "14 Days",
/// "40 laptops", "open", "ops@acme.com", "SEV-1", "2. Scope", "Purchase
/// order that the Customer issues and the Supplier accepts".
/// Names that merely hold such words ("May Chen", "3M", "Open Systems
/// Ltd", "1 World Trade Center") are entities, and so are descriptive
/// references ("the order form for the Corvid Workspace seats"), which
/// resolution can bring to their entity.
pub fn non_entity_kind(name: &str) -> Option<&'static str> {
    let lower = name.trim().to_lowercase();
    if STATUS_WORDS.contains(&lower.as_str()) {
        return Some("a status");
    }
    // An address is contact data of an entity (a person's, a team's
    // mailbox), which the ontology's properties hold, not an entity.
    if is_email_address(&lower) {
        return Some("an e-mail address");
    }
    if is_severity_level(&lower) {
        return Some("a severity or priority level");
    }
    let words: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .collect();
    let is_number = |w: &str| {
        let digits = w.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let suffix = &w[digits.len()..];
        !digits.is_empty()
            && digits
                .chars()
                .all(|c| c.is_ascii_digit() || c == '.' || c == ',')
            && digits.chars().any(|c| c.is_ascii_digit())
            && matches!(suffix, "" | "st" | "nd" | "rd" | "th")
    };
    let is_quarter = |w: &str| {
        w.len() == 2 && w.starts_with('q') && ('1'..='4').contains(&w.chars().nth(1).unwrap_or('0'))
    };
    let has_month = words.iter().any(|w| is_month(w));
    let has_quarter = words.iter().any(|w| is_quarter(w));
    let all_date_words = words
        .iter()
        .all(|w| is_number(w) || is_month(w) || is_quarter(w));
    if (has_month || has_quarter) && all_date_words && words.iter().any(|w| is_number(w)) {
        return Some("a date");
    }
    let amount_part = |w: &str| {
        let bare = w.trim_start_matches(['$', '€', '£', '¥']);
        CURRENCIES.contains(&w) || is_number(bare) || matches!(bare, "k" | "m" | "million")
    };
    // A price is an amount per something ("USD 14.50 per seat per month").
    let amount = match words.iter().position(|w| *w == "per") {
        Some(at) if at > 0 => &words[..at],
        _ => &words[..],
    };
    let has_currency = CURRENCIES.iter().any(|c| {
        amount
            .iter()
            .any(|w| w == c || (c.len() == 1 && w.starts_with(c)))
    });
    if has_currency
        && amount.iter().all(|w| amount_part(w))
        && amount
            .iter()
            .any(|w| is_number(w.trim_start_matches(['$', '€', '£', '¥'])))
    {
        return Some("an amount");
    }
    // A line of an order or an invoice: a money amount beside other words
    // ("Corvid Workspace seats at $14.50"). A name does not carry a price;
    // the thing priced is named without it (a price in brackets at the end
    // is cut off before this check, see [`without_price`](super::prices::without_price)).
    if has_price(&lower) {
        return Some("a priced line");
    }
    // A span of time: a number, then only units ("14 Days", "30 business
    // days"); a model capitalises them, so the count rule below misses them.
    if words.len() >= 2
        && is_number(words[0])
        && words[1..]
            .iter()
            .all(|w| DURATION_UNITS.contains(w) || DURATION_QUALIFIERS.contains(w))
        && words[1..].iter().any(|w| DURATION_UNITS.contains(w))
    {
        return Some("a duration");
    }
    // A count of common nouns: the original text has no capital after the
    // number ("40 laptops", not "1 World Trade Center").
    let original: Vec<&str> = name.split_whitespace().collect();
    if original.len() >= 2
        && is_number(&original[0].to_lowercase())
        && original[1..]
            .iter()
            .all(|w| w.chars().next().is_some_and(|c| !c.is_uppercase()))
    {
        return Some("a quantity");
    }
    // A numbered heading ("2. Scope", "7.1. Payment"): a section of a
    // document, not a name of one.
    let section_number = |w: &str| {
        w.len() >= 2
            && w.ends_with('.')
            && w.chars().all(|c| c.is_ascii_digit() || c == '.')
            && w.starts_with(|c: char| c.is_ascii_digit())
    };
    if original.len() >= 2 && section_number(original[0]) {
        return Some("a section heading");
    }
    // A clause: names are capitalised but for a few particles ("Draft MSA
    // between Acme Corp and Northwind"); five words in lower case make a
    // passage ("Purchase order that the Customer issues and the Supplier
    // accepts"), unless a determiner leads it: "the order form for the
    // Corvid Workspace seats" is a descriptive reference, which resolution
    // can bring to its entity.
    let lower_words = original
        .iter()
        .filter(|w| w.chars().next().is_some_and(char::is_lowercase))
        .count();
    let determiner = original
        .first()
        .is_some_and(|w| DETERMINERS.contains(&w.to_lowercase().as_str()));
    if lower_words >= 5 && !determiner {
        return Some("a clause");
    }
    // A day said relative to the text ("Imaging starts tomorrow"): names
    // write such words capitalised ("The Today Show"), sentences do not.
    if original.len() >= 2 && original.iter().any(|w| RELATIVE_DAYS.contains(w)) {
        return Some("a clause");
    }
    // Someone's group or thing, told by a possessive and common nouns
    // ("Ingrid's legal team", "Hamid's last day"); a possessive name with
    // no lower-case words after it ("McDonald's", "Moody's Investors
    // Service") is a name.
    if let Some(at) = original
        .iter()
        .position(|w| w.ends_with("'s") || w.ends_with("\u{2019}s"))
    {
        let rest = &original[at + 1..];
        if !rest.is_empty()
            && rest
                .iter()
                .all(|w| w.chars().next().is_some_and(char::is_lowercase))
        {
            return Some("a description");
        }
    }
    // A choice between names ("Owen or Felix"): not one entity.
    if original.len() >= 3
        && original.windows(3).any(|w| {
            w[1] == "or"
                && w[0].starts_with(char::is_uppercase)
                && w[2].starts_with(char::is_uppercase)
        })
    {
        return Some("a choice between names");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_amounts_quantities_and_statuses_are_told_from_names() {
        for (name, kind) in [
            ("March 1, 2025", "a date"),
            ("1 March 2025", "a date"),
            ("Sept. 3rd", "a date"),
            ("Q3 2025", "a date"),
            ("$1,200", "an amount"),
            ("300 EUR", "an amount"),
            ("USD 5 million", "an amount"),
            ("USD 14.50 per seat per month", "an amount"),
            ("Corvid Workspace seats at $14.50", "a priced line"),
            ("Support renewal: 1,200 EUR", "a priced line"),
            ("14 Days", "a duration"),
            ("30 Business Days", "a duration"),
            ("36 months", "a duration"),
            ("40 laptops", "a quantity"),
            ("3 units of stock", "a quantity"),
            ("open", "a status"),
            ("In progress", "a status"),
            ("2. Scope", "a section heading"),
            ("7.1. Payment Terms", "a section heading"),
            (
                "Purchase order that the Customer issues and the Supplier accepts",
                "a clause",
            ),
            (
                "Quoted unit price for at least thirty (30) days from the date of the quote",
                "a clause",
            ),
            ("Imaging starts tomorrow", "a clause"),
            ("Ingrid's legal team", "a description"),
            ("Hamid\u{2019}s last day", "a description"),
            ("Owen or Felix or Owen or Felix", "a choice between names"),
            ("engineering@tidewell.io", "an e-mail address"),
            ("Priya.Raman+po@acme-corp.co.uk", "an e-mail address"),
            ("SEV-1", "a severity or priority level"),
            ("Sev 2", "a severity or priority level"),
            ("P1", "a severity or priority level"),
            ("Priority 0", "a severity or priority level"),
        ] {
            assert_eq!(non_entity_kind(name), Some(kind), "{name}");
        }
        for name in [
            "May Chen",
            "March Networks",
            "3M",
            "7-Eleven",
            "Open Systems Ltd",
            "1 World Trade Center",
            "PO-4471",
            "Order form OF-601",
            "Acme Corp",
            "20th Century Fox",
            "7 Days Inn",
            "Per Larsen",
            "2.0 Release Train",
            "Draft MSA between Acme Corp and Northwind Outfitters",
            "the order form for the Corvid Workspace seats",
            "the master services agreement effective 15 April 2024",
            "our existing agreement with them",
            "International Brotherhood of Electrical Workers Local Union No. 1245",
            "The Today Show",
            "McDonald's",
            "Moody's Investors Service",
            "Procter and Gamble",
            "Priya Raman <priya@acme.com>",
            "Booking.com",
            "@tidewell",
            "P10 Industries",
            "PS5",
            "Sevco 1",
            "USD Partners LP",
            "$ave-More Stores",
            "Euro 2024 Committee",
        ] {
            assert_eq!(non_entity_kind(name), None, "{name}");
        }
    }
}
