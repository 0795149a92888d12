//! Verbs that move or hand something from one holder to another.

/// Whether `word` (in lower case) is a form of a verb of moving from one
/// thing to another: move, switch, migrate, transfer.
/// Cue `moving_verb`.
pub(crate) fn is_moving_verb(word: &str) -> bool {
    matches!(
        word,
        "move"
            | "moves"
            | "moved"
            | "moving"
            | "switch"
            | "switches"
            | "switched"
            | "switching"
            | "migrate"
            | "migrates"
            | "migrated"
            | "migrating"
            | "transfer"
            | "transfers"
            | "transferred"
            | "transferring"
    )
}

/// Whether two words in a row (in lower case) are a form of "take over":
/// someone taking a thing over from the one who held it.
/// Cue `taking_over`.
pub(crate) fn is_taking_over(first: &str, second: &str) -> bool {
    matches!(first, "take" | "takes" | "took" | "taking" | "taken") && second == "over"
}
