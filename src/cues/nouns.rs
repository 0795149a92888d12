//! Common nouns and defined terms offered as names: a phrase the texts
//! write in lower case ("the account executive"), a party named only as
//! "the Client".

use super::words::Written;
use crate::text::words;

/// Whether `name` is a common noun phrase rather than a name, as the
/// texts a model was shown write it: every whole-word occurrence of its
/// words there is in lower case ("hardware", "the account executive", "a
/// purchase order"), none capitalised, and the name holds no digit or
/// code punctuation (slugs and codes such as "harbour-gateway" or
/// "po-4417" are identifiers). The capital a sentence starts with does not
/// make a phrase of several words a name ("Load tests showed no gain"):
/// names capitalise their other words too. A single word capitalised only
/// where sentences start is a common noun when a text also writes it in
/// lower case as a word of its own ("Legal sent the contract" next to
/// "the contract legal forwarded"), and a name otherwise ("Acme
/// confirmed", even beside `dana@acme.com`). The texts are the episode and
/// the earlier episodes shown as its context: a model also lifts names
/// out of the context ("Computer Hardware" from the clause before). A
/// name no text writes is left to the other checks. Names styled in lower
/// case ("nginx") are caught too unless a text also writes them
/// capitalised: the price of this rule.
pub fn common_noun(name: &str, texts: &[Written<'_>]) -> bool {
    // A digit marks a code; code punctuation marks a slug, unless the name
    // is several words ("twelve-month subscription" is a phrase).
    let slug =
        !name.trim().contains(char::is_whitespace) && name.chars().any(|c| "-_.@/#".contains(c));
    if slug || name.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let wanted: Vec<String> = words(name).map(str::to_lowercase).collect();
    if wanted.is_empty() {
        return false;
    }
    let capitalised = |w: &str| w.chars().any(char::is_uppercase);
    // Seen in lower case: anywhere, and as words of their own.
    let (mut lower, mut lower_words) = (false, false);
    let mut opens_capitalised = false;
    for (t, at, window) in texts
        .iter()
        .flat_map(|t| t.occurrences_at(&wanted).map(move |(at, w)| (t, at, w)))
    {
        // One word capitalised as the last of a longer name ("since
        // Payments Engineering took it over") is that name's head noun:
        // it says nothing of the word alone (`engineering@tidewell.io`).
        if wanted.len() == 1 && t.ends_a_longer_name(at) {
            continue;
        }
        let named = window
            .iter()
            .enumerate()
            .any(|(i, w)| capitalised(w.text) && !(i == 0 && w.opens));
        if named {
            return false;
        }
        if capitalised(window[0].text) {
            opens_capitalised = true;
        } else {
            lower = true;
            lower_words |= window.iter().all(|w| w.plain);
        }
    }
    if wanted.len() == 1 && opens_capitalised {
        lower_words
    } else {
        lower || opens_capitalised
    }
}

/// Whether the texts write `name`, one word, only as a term that stands
/// for a party, the way contracts and forms name their parties: defined
/// in quotes or as a field label at least once (`Northwind Outfitters
/// (the "Client")`, "Client: Northwind Outfitters") and otherwise only
/// after "the" ("The Client shall …"). The party itself is named
/// elsewhere. A word never defined so is left alone, however often "the"
/// comes before it ("the Acme account" is Acme's).
pub fn only_a_defined_term(name: &str, texts: &[Written<'_>]) -> bool {
    let mut wanted: Vec<String> = words(name).map(str::to_lowercase).collect();
    if wanted.len() == 2 && wanted[0] == "the" {
        wanted.remove(0);
    }
    if wanted.len() != 1 || name.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let quote = |c: Option<char>| c.is_some_and(|c| "\"“”'‘’".contains(c));
    let mut defined = false;
    for t in texts {
        for (i, w) in t.words.iter().enumerate() {
            if w.text.to_lowercase() != wanted[0] {
                continue;
            }
            let end = w.at + w.text.len();
            let quoted =
                quote(t.text[..w.at].chars().next_back()) && quote(t.text[end..].chars().next());
            let label = t.text[end..].starts_with(':');
            let the = i > 0 && t.words[i - 1].text.eq_ignore_ascii_case("the");
            if quoted || label {
                defined = true;
            } else if !the {
                return false;
            }
        }
    }
    defined
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`common_noun`] over texts given as strings.
    fn noun(name: &str, texts: &[&str]) -> bool {
        let written: Vec<Written> = texts.iter().map(|t| Written::new(t)).collect();
        common_noun(name, &written)
    }

    #[test]
    fn a_party_written_only_as_the_party_or_a_label_is_a_defined_term() {
        let term = |name: &str, texts: &[&str]| {
            let written: Vec<Written> = texts.iter().map(|t| Written::new(t)).collect();
            only_a_defined_term(name, &written)
        };
        let contract = "Halvorsen IT Services (\"Provider\") and Northwind Outfitters \
                        (the \"Client\"). The Client shall give notice.";
        let form = "Provider: Halvorsen IT Services. Client: Northwind Outfitters.";
        assert!(term("Client", &[contract, form]));
        assert!(term("The Client", &[contract]));
        assert!(term("Client", &[form, "The Client may add devices."]));
        // Once without "the" or a definition: a name (or not provably a term).
        assert!(!term("Provider", &[contract, "Provider invoices monthly."]));
        assert!(!term("Ledger", &["The Ledger: paged. Ledger is down."]));
        // Never defined: "the" before a name does not make it a term.
        assert!(!term(
            "Acme",
            &["We renewed the Acme MSA. The Acme account grew."]
        ));
        // Several words, or a code: names.
        assert!(!term("Ledger Service", &["the Ledger Service paged"]));
        assert!(!term("OF-12", &["the OF-12 order form"]));
    }

    #[test]
    fn a_name_the_text_writes_only_in_lower_case_is_a_noun() {
        let text = &[
            "Acme resells computer hardware and software. The account executive \
             raised a purchase order; see harbour-gateway. Order more? Priya said so.",
        ][..];
        assert!(noun("Hardware", text));
        assert!(noun("Account executive", text));
        assert!(noun("purchase order", text));
        // Capitalised only where a sentence starts, and written in lower
        // case as a word elsewhere.
        assert!(noun("Order", text));
        // Written capitalised mid-sentence: a name (or at least not
        // provably a common noun).
        assert!(!noun("Priya", text));
        assert!(!noun("Acme", text));
        // Identifiers and names the text does not write are left alone.
        assert!(!noun("harbour-gateway", text));
        assert!(!noun("PO-4417", text));
        assert!(noun(
            "Twelve-Month Subscription",
            &["a twelve-month subscription"]
        ));
        assert!(!noun("Northwind", text));
        // Capitalised only as the last word of a longer name, and written
        // in lower case in an address: the longer name's head noun. After
        // a word that opens the line it is a name.
        let mail = &["To: engineering@tidewell.io\n\nSince Payments Engineering took it over."][..];
        assert!(noun("engineering", mail));
        assert!(!noun(
            "Engineering",
            &["Since Payments Engineering took it over."]
        ));
        assert!(!noun(
            "Maya",
            &["To: maya@tidewell.io\n\nDear Maya, thanks."]
        ));
    }

    #[test]
    fn a_phrase_capitalised_only_where_a_sentence_starts_is_a_noun() {
        let text = &[
            "We moved to the new cache cluster on 9 September. Load tests showed \
             no gain.\n- Cache warmers ran twice. Relaywave confirmed; \"Skylark routing\" \
             is new. Line items: {\"description\": \"Onsite deployment engineer\"}",
        ][..];
        assert!(noun("load tests", text));
        assert!(noun("Load Tests", text));
        // A line opens a sentence too (a list item).
        assert!(noun("cache warmers", text));
        // One word that no text writes in lower case keeps its capital
        // wherever it stands.
        assert!(!noun("Relaywave", text));
        // Capitalised after a semicolon and an opening quote: mid-sentence.
        assert!(!noun("Skylark routing", text));
        // A value after a label is styled by its writer.
        assert!(!noun("Onsite deployment engineer", text));
    }

    #[test]
    fn one_word_capitalised_only_where_sentences_start_is_a_common_noun_when_also_written_in_lower_case()
     {
        let episode = "Dana Whitcombe: Legal sent over the new contract. Acme confirmed.";
        let context = "Ingrid says their legal team will tell us. Mail dana@acme.com or acme-ops.";
        assert!(noun("Legal", &[episode, context]));
        // Lower case only inside an address or a slug is no evidence.
        assert!(!noun("Acme", &[episode, context]));
        // With no lower-case word at all, a sentence's first word stays a name.
        assert!(!noun("Legal", &[episode]));
    }

    #[test]
    fn a_name_lifted_from_the_context_in_lower_case_is_a_common_noun_and_one_capitalised_anywhere_is_not()
     {
        let episode = "It may return unopened hardware within 14 days.";
        let context = "The Supplier resells computer hardware and support services.";
        let titled = "Support Services are billed monthly.";
        // Only the context writes it, in lower case.
        assert!(noun("Computer Hardware", &[episode, context]));
        // Without the context it is a name no text writes: left alone.
        assert!(!noun("Computer Hardware", &[episode]));
        // Capitalised in one text, lower case in another: not provably a noun.
        assert!(!noun("Support Services", &[context, titled]));
    }
}
