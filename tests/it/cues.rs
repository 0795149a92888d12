//! The cue registry is the one list of rules that read English wording:
//! these tests keep it, the `src/cues/` files and `docs/cues.md` saying
//! the same thing, so a rule cannot hide outside the list or linger in it
//! after its code is gone.

use std::collections::{BTreeMap, BTreeSet};

use graphloom::cues::{REGISTRY, cue};

fn cue_files() -> BTreeMap<String, String> {
    let dir = crate::common::repo().join("src/cues");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("read src/cues") {
        let path = entry.expect("entry").path();
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("file name");
        if path.extension().is_some_and(|e| e == "rs") && stem != "mod" {
            let text = std::fs::read_to_string(&path).expect("read cue file");
            files.insert(stem.to_string(), text);
        }
    }
    files
}

#[test]
fn every_cue_has_a_unique_snake_case_name_and_is_found_by_it() {
    let mut seen = BTreeSet::new();
    for c in REGISTRY {
        assert!(seen.insert(c.name), "cue `{}` is registered twice", c.name);
        assert!(
            !c.name.is_empty()
                && c.name.starts_with(|ch: char| ch.is_ascii_lowercase())
                && c.name
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_'),
            "cue name `{}` is not snake_case",
            c.name
        );
        assert!(
            !c.decides.trim().is_empty(),
            "cue `{}` says nothing of what it decides",
            c.name
        );
        assert_eq!(cue(c.name).map(|found| found.module), Some(c.module));
    }
    assert!(cue("no_such_cue").is_none());
}

/// Whether `text` declares an item `name` with keyword `kw`: the name
/// stands whole after it (`fn stated_end(`, not `fn stated_end_after(`).
fn declares(text: &str, kw: &str, name: &str) -> bool {
    let head = format!("{kw} {name}");
    text.match_indices(&head).any(|(at, _)| {
        !text[at + head.len()..].starts_with(|ch: char| ch.is_alphanumeric() || ch == '_')
    })
}

#[test]
fn every_cue_file_holds_registered_rules_and_every_rule_names_its_file() {
    let files = cue_files();
    let registered: BTreeSet<&str> = REGISTRY.iter().map(|c| c.module).collect();
    for module in files.keys() {
        assert!(
            registered.contains(module.as_str()),
            "src/cues/{module}.rs has no entry in cues::REGISTRY"
        );
    }
    for c in REGISTRY {
        let text = files.get(c.module).unwrap_or_else(|| {
            panic!(
                "cue `{}` names src/cues/{}.rs, which is missing",
                c.name, c.module
            )
        });
        // The rule is the item of that name, or the code a "Cue `name`"
        // comment marks.
        let item = ["fn", "struct", "const", "static", "enum"]
            .iter()
            .any(|kw| declares(text, kw, c.name));
        let marked = text.contains(&format!("Cue `{}`", c.name));
        assert!(
            item || marked,
            "cue `{}`: src/cues/{}.rs has no item of that name and no \"Cue `{}`\" comment",
            c.name,
            c.module,
            c.name
        );
    }
}

#[test]
fn docs_cues_lists_every_cue_with_its_language_and_file() {
    let doc = std::fs::read_to_string(crate::common::repo().join("docs/cues.md"))
        .expect("read docs/cues.md");
    let mut rows = BTreeMap::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if cells.len() >= 3 && cells[0].starts_with('`') && cells[0].ends_with('`') {
            rows.insert(
                cells[0].trim_matches('`').to_string(),
                (cells[1].to_string(), cells[2].to_string()),
            );
        }
    }
    for c in REGISTRY {
        let (language, module) = rows
            .remove(c.name)
            .unwrap_or_else(|| panic!("docs/cues.md has no row for cue `{}`", c.name));
        assert_eq!(
            language,
            c.language.code(),
            "docs/cues.md: language of `{}`",
            c.name
        );
        assert_eq!(
            module,
            format!("`{}`", c.module),
            "docs/cues.md: file of `{}`",
            c.name
        );
    }
    assert!(
        rows.is_empty(),
        "docs/cues.md lists cues the registry does not: {:?}",
        rows.keys()
    );
}

#[test]
fn a_pipelines_language_turns_off_the_cues_of_other_languages_and_a_switch_overrides_it() {
    use graphloom::cues::Switches;
    let none = BTreeMap::new();
    let english = Switches::new("en", &none);
    let german = Switches::new("de", &none);
    for c in REGISTRY {
        assert_eq!(english.on(c.name), c.language.code() == "en", "{}", c.name);
        assert_eq!(german.on(c.name), c.language.code() == "de", "{}", c.name);
    }
    let overrides = BTreeMap::from([
        ("common_noun".to_string(), false),
        ("mail_headers".to_string(), true),
    ]);
    let switched = Switches::new("de", &overrides);
    assert!(switched.on("mail_headers"));
    assert!(!switched.on("common_noun"));
    // A cue that is off is not even evaluated, and counts nothing; one that
    // is on counts the times it held.
    assert!(!switched.fires("common_noun", || panic!("an off cue is not read")));
    assert!(switched.fires("mail_headers", || true));
    assert!(!switched.fires("mail_headers", || false));
    let (fired, off) = switched.counts();
    assert!(fired.contains(&("mail_headers", 1)), "{fired:?}");
    assert!(off.contains(&"common_noun"), "{off:?}");
    // Clones share the counts: every task of a run adds to one tally.
    let clone = switched.clone();
    assert!(clone.fires("mail_headers", || true));
    assert!(switched.counts().0.contains(&("mail_headers", 2)));
}

#[test]
fn a_switch_naming_no_cue_is_refused_with_the_list_of_cues() {
    let body = "[output]\ngraph = \"file:///tmp/graphloom-cue-switch\"\n\n[extract.cues]\ncommon_nouns = false\n";
    let err = graphloom::spec::PipelineSpec::from_toml(body, std::path::Path::new("p.toml"))
        .expect_err("an unknown cue");
    let message = err.to_string();
    assert!(message.contains("extract.cues.common_nouns"), "{message}");
    assert!(message.contains("common_noun,"), "{message}");
    let body =
        "[output]\ngraph = \"file:///tmp/graphloom-cue-switch\"\n\n[extract]\nlanguage = \"\"\n";
    let err = graphloom::spec::PipelineSpec::from_toml(body, std::path::Path::new("p.toml"))
        .expect_err("an empty language");
    assert!(err.to_string().contains("extract.language"), "{err}");
}
