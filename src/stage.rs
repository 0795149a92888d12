//! The stages of a command, by name: what `failures.stage` and
//! `llm_calls.stage` hold, and what reports time. One enum, so that a stage
//! is spelt once and a typo is a compile error rather than a new stage.

use std::fmt;

/// A stage of `run` or `add`: an LLM call's purpose, where an item failed,
/// or a timed phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Stage {
    /// Listing and parsing the source, and the anti-join with committed
    /// episodes.
    Source,
    /// Opening the graph for writing (lock, recovery, base versions).
    Open,
    /// Records turned into entities and facts by `[[mapping]]` rules.
    MapRecords,
    /// One call per episode for its entities.
    ExtractEntities,
    /// The entity subtype walk.
    ClassifyEntities,
    /// One call per episode for its facts.
    ExtractFacts,
    /// The edge subtype walk.
    ClassifyFacts,
    /// Resolution and building the rows (timing).
    Resolve,
    /// The LLM's verdict on ambiguous entity matches.
    Adjudicate,
    /// The LLM's verdict on facts that may contradict earlier ones.
    Contradictions,
    /// Node summaries.
    Summaries,
    /// Fact resolution (duplicates, invalidation).
    ResolveFacts,
    /// Embeddings of node names.
    EmbedNames,
    /// Embeddings of fact texts.
    EmbedFacts,
    /// `graphloom add`: reading its input file.
    Read,
    /// `graphloom add`: parsing and checking the lines.
    Load,
    /// `graphloom add`: a line that could not be loaded.
    Add,
    /// The table commits and the `runs` row.
    Commit,
    /// `graphloom bench llm`: the load test's calls.
    Bench,
}

impl Stage {
    /// The name stored in tables and printed in reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Source => "source",
            Stage::Open => "open",
            Stage::MapRecords => "map_records",
            Stage::ExtractEntities => "extract_entities",
            Stage::ClassifyEntities => "classify_entities",
            Stage::ExtractFacts => "extract_facts",
            Stage::ClassifyFacts => "classify_facts",
            Stage::Resolve => "resolve",
            Stage::Adjudicate => "adjudicate",
            Stage::Contradictions => "contradictions",
            Stage::Summaries => "summaries",
            Stage::ResolveFacts => "resolve_facts",
            Stage::EmbedNames => "embed_names",
            Stage::EmbedFacts => "embed_facts",
            Stage::Read => "read",
            Stage::Load => "load",
            Stage::Add => "add",
            Stage::Commit => "commit",
            Stage::Bench => "bench",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so that width and alignment (`{:<20}`) apply.
        f.pad(self.as_str())
    }
}

impl From<Stage> for String {
    fn from(s: Stage) -> String {
        s.as_str().to_string()
    }
}

/// Timed phases of a command, in the order they ran (a phase may appear
/// more than once, e.g. `open` before and after the graph's base is read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timings(pub Vec<(Stage, f64)>);

impl Timings {
    /// Seconds spent in `stage` (0 when it did not run).
    pub fn of(&self, stage: Stage) -> f64 {
        self.0
            .iter()
            .filter(|(s, _)| *s == stage)
            .map(|(_, t)| t)
            .sum()
    }

    /// Records `stage` as having run from `since` until now; returns now,
    /// the start of the next phase.
    pub fn lap(&mut self, stage: Stage, since: std::time::Instant) -> std::time::Instant {
        let now = std::time::Instant::now();
        self.0.push((stage, (now - since).as_secs_f64()));
        now
    }

    /// The phases and their seconds.
    pub fn iter(&self) -> impl Iterator<Item = (Stage, f64)> + '_ {
        self.0.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names_are_distinct_snake_case() {
        let all = [
            Stage::Source,
            Stage::Open,
            Stage::ExtractEntities,
            Stage::ClassifyEntities,
            Stage::ExtractFacts,
            Stage::ClassifyFacts,
            Stage::Resolve,
            Stage::Adjudicate,
            Stage::Contradictions,
            Stage::Summaries,
            Stage::ResolveFacts,
            Stage::EmbedNames,
            Stage::EmbedFacts,
            Stage::Read,
            Stage::Load,
            Stage::Add,
            Stage::Commit,
            Stage::Bench,
        ];
        let names: std::collections::BTreeSet<&str> = all.iter().map(|s| s.as_str()).collect();
        assert_eq!(names.len(), all.len());
        assert!(
            names
                .iter()
                .all(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        );
        assert_eq!(format!("{:<8}|", Stage::Open), "open    |");
    }
}
