//! E-mail headers: which lines are headers, and the organisation a
//! writer's address names.

/// The mention an e-mail header line's address names as the writer's
/// organisation: one whose name, folded like a company's (lower case,
/// corporate suffixes dropped, no spaces), is a label of the address's
/// domain other than its last ("Relaywave Ltd" for
/// `beatrix.holm@relaywave.com`, "Acme Corp" for `dana@mail.acme.co.uk`).
/// Which mention that is, is read off the address and the names alone: a
/// person's name is no domain label.
/// Cue `mail_domain_org`.
pub(crate) fn org_of_address(line: &str, folded: &[String]) -> Option<usize> {
    let (_, after) = line.split_once('@')?;
    let domain: String = after
        .chars()
        .take_while(|c| c.is_alphanumeric() || matches!(c, '.' | '-'))
        .collect::<String>()
        .to_lowercase();
    let labels: Vec<&str> = domain.split('.').collect();
    let (_, named) = labels.split_last()?;
    let named: Vec<String> = named.iter().map(|l| l.replace('-', "")).collect();
    folded
        .iter()
        .position(|f| !f.is_empty() && named.iter().any(|l| l == f))
}

/// E-mail header lines, in lower case.
/// Cue `mail_headers`.
pub(crate) const HEADERS: [&str; 7] = [
    "from:",
    "to:",
    "cc:",
    "bcc:",
    "subject:",
    "date:",
    "reply-to:",
];
