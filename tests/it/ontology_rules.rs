//! The rules that make a pipeline spec and its ontology valid: one failing
//! spec per rule, each checked for the issue's path and the words of its
//! message, plus the example pipeline as a known-good ontology.
//!
//! Specs are small TOML strings; large ontologies (101 types, 11 subtypes,
//! 5 levels) are generated as TOML text.

use std::path::{Path, PathBuf};

use graphloom::ontology::{Ontology, OntologyError, OntologyIssue};
use graphloom::spec::{PipelineSpec, SpecError};

/// The part every spec needs.
const OUTPUT: &str = "[output]\ngraph = \"file:///tmp/graphloom-ontology-rules\"\n\n";

/// Parses `[output]` followed by `body`.
fn parse(body: &str) -> Result<PipelineSpec, SpecError> {
    PipelineSpec::from_toml(&format!("{OUTPUT}{body}"), Path::new("rules.toml"))
}

/// A spec that must parse.
fn spec(body: &str) -> PipelineSpec {
    parse(body).unwrap_or_else(|e| panic!("spec should parse: {e}\n--- body ---\n{body}"))
}

/// A spec that must be rejected while parsing, as its rendered message.
fn spec_error(body: &str) -> SpecError {
    match parse(body) {
        Ok(_) => panic!("spec should be rejected\n--- body ---\n{body}"),
        Err(e) => e,
    }
}

/// Validates the ontology of a spec.
fn validate(body: &str) -> Result<Ontology, OntologyError> {
    Ontology::try_from(&spec(body).ontology)
}

/// An ontology that must be valid.
fn ontology(body: &str) -> Ontology {
    validate(body).unwrap_or_else(|e| panic!("ontology should be valid: {e}\n--- body ---\n{body}"))
}

/// Every issue of an ontology that must be invalid.
fn issues(body: &str) -> Vec<OntologyIssue> {
    match validate(body) {
        Ok(_) => panic!("ontology should be invalid\n--- body ---\n{body}"),
        Err(OntologyError::Invalid(issues)) => {
            assert!(!issues.is_empty(), "Invalid must carry at least one issue");
            issues
        }
        Err(other) => panic!("an ontology error other than Invalid: {other}"),
    }
}

/// The single issue of an ontology that breaks exactly one rule.
fn only_issue(body: &str) -> OntologyIssue {
    let mut all = issues(body);
    assert_eq!(all.len(), 1, "expected exactly one issue, got {all:#?}");
    all.remove(0)
}

/// Checks an issue's exact path and that its message holds every word.
fn assert_issue(issue: &OntologyIssue, path: &str, words: &[&str]) {
    assert_eq!(issue.path, path, "path of {issue}");
    for word in words {
        assert!(
            issue.message.contains(word),
            "message of {issue} should contain {word:?}"
        );
    }
}

/// Checks a rendered spec error holds every word.
fn assert_mentions(error: &SpecError, words: &[&str]) {
    let text = error.to_string();
    for word in words {
        assert!(text.contains(word), "{text:?} should contain {word:?}");
    }
}

/// A minimal valid entity type, with extra TOML lines for the same table.
fn entity_with(name: &str, extra: &str) -> String {
    format!(
        "[[ontology.entity_types]]\nname = \"{name}\"\ndescription = \"A {name}; not anything else.\"\n{extra}\n"
    )
}

fn entity(name: &str) -> String {
    entity_with(name, "")
}

/// Several minimal entity types.
fn entities<S: AsRef<str>>(names: &[S]) -> String {
    names.iter().map(|n| entity(n.as_ref())).collect()
}

/// A minimal valid edge type, with extra TOML lines for the same table.
fn edge_with(name: &str, extra: &str) -> String {
    format!(
        "[[ontology.edge_types]]\nname = \"{name}\"\ndescription = \"When {name} holds.\"\n{extra}\n"
    )
}

fn edge(name: &str) -> String {
    edge_with(name, "")
}

/// `[ontology.entity_type_hierarchy]` with the given lines.
fn entity_hierarchy(lines: &str) -> String {
    format!("[ontology.entity_type_hierarchy]\n{lines}\n")
}

/// `[ontology.edge_type_hierarchy]` with the given lines.
fn edge_hierarchy(lines: &str) -> String {
    format!("[ontology.edge_type_hierarchy]\n{lines}\n")
}

/// An inline table holding `children` as leaves: `{ A = {}, B = {} }`.
fn leaves<S: AsRef<str>>(children: &[S]) -> String {
    let inner: Vec<String> = children
        .iter()
        .map(|c| format!("{} = {{}}", c.as_ref()))
        .collect();
    format!("{{ {} }}", inner.join(", "))
}

/// A chain as one hierarchy line: `L0 = { L1 = { L2 = {} } }`.
fn chain_line<S: AsRef<str>>(chain: &[S]) -> String {
    fn nested<S: AsRef<str>>(rest: &[S]) -> String {
        match rest.split_first() {
            None => "{}".to_string(),
            Some((head, tail)) => format!("{{ {} = {} }}", head.as_ref(), nested(tail)),
        }
    }
    let (top, rest) = chain.split_first().expect("a chain has a top-level type");
    format!("{} = {}", top.as_ref(), nested(rest))
}

/// `prefix0`, `prefix1`, ...
fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn procurement_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("pipelines/procurement.toml")
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

// ---------------------------------------------------------------------------
// 1. Hierarchy keys are declared types.

#[test]
fn hierarchy_key_must_be_a_declared_type() {
    // An undeclared subtype in the entity hierarchy.
    let issue = only_issue(&format!(
        "{}{}",
        entities(&["Contract", "PurchaseOrder"]),
        entity_hierarchy("Contract = { PurchaseOrder = {}, Ghost = {} }"),
    ));
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.Contract.Ghost",
        &[
            "`Ghost`",
            "not a declared entity type",
            "ontology.entity_types",
        ],
    );

    // An undeclared top-level key.
    let issue = only_issue(&format!(
        "{}{}",
        entity("Person"),
        entity_hierarchy("Human = { Person = {} }"),
    ));
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.Human",
        &["`Human`", "not a declared entity type"],
    );

    // An undeclared subtype in the edge hierarchy.
    let issue = only_issue(&format!(
        "{}{}",
        edge("EMPLOYED_BY"),
        edge_hierarchy("EMPLOYED_BY = { MOONLIGHTS_FOR = {} }"),
    ));
    assert_issue(
        &issue,
        "ontology.edge_type_hierarchy.EMPLOYED_BY.MOONLIGHTS_FOR",
        &[
            "`MOONLIGHTS_FOR`",
            "not a declared edge type",
            "ontology.edge_types",
        ],
    );

    // An entity type is not an edge type: the namespaces are separate.
    let issue = only_issue(&format!(
        "{}{}{}",
        entity("Person"),
        edge("KNOWS"),
        edge_hierarchy("KNOWS = { Person = {} }"),
    ));
    assert_issue(
        &issue,
        "ontology.edge_type_hierarchy.KNOWS.Person",
        &["`Person`", "not a declared edge type"],
    );
}

// ---------------------------------------------------------------------------
// 2. One parent per type.

#[test]
fn type_has_at_most_one_parent() {
    let issue = only_issue(&format!(
        "{}{}",
        entities(&["Document", "Contract", "Invoice"]),
        entity_hierarchy("Document = { Invoice = {} }\nContract = { Invoice = {} }"),
    ));
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.Contract.Invoice",
        &[
            "`Invoice`",
            "two parents",
            "Document",
            "Contract",
            "one parent",
        ],
    );

    // Top level and under a parent is two places as well.
    let issue = only_issue(&format!(
        "{}{}",
        entities(&["Invoice", "Contract"]),
        entity_hierarchy("Invoice = {}\nContract = { Invoice = {} }"),
    ));
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.Contract.Invoice",
        &["`Invoice`", "two parents", "the top level", "Contract"],
    );

    // A type placed below itself is caught the same way (no cycle).
    let issue = only_issue(&format!(
        "{}{}",
        entities(&["A", "B"]),
        entity_hierarchy("A = { B = { A = {} } }"),
    ));
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.A.B.A",
        &["`A`", "two parents"],
    );

    // Same rule for edge types.
    let issue = only_issue(&format!(
        "{}{}{}{}",
        edge("RELATED_TO"),
        edge("KNOWS"),
        edge("WORKS_WITH"),
        edge_hierarchy("RELATED_TO = { WORKS_WITH = {} }\nKNOWS = { WORKS_WITH = {} }"),
    ));
    assert_issue(
        &issue,
        "ontology.edge_type_hierarchy.KNOWS.WORKS_WITH",
        &["`WORKS_WITH`", "two parents", "RELATED_TO", "KNOWS"],
    );
}

// ---------------------------------------------------------------------------
// 3. At most 10 direct subtypes.

fn fan_out(parent: &str, n: usize) -> String {
    let children = names("Sub", n);
    format!(
        "{}{}{}",
        entity(parent),
        entities(&children),
        entity_hierarchy(&format!("{parent} = {}", leaves(&children))),
    )
}

#[test]
fn at_most_ten_direct_subtypes() {
    let ok = ontology(&fan_out("Root", 10));
    assert_eq!(ok.entity_tree.get("Root").unwrap().children.len(), 10);

    let issue = only_issue(&fan_out("Root", 11));
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.Root",
        &["`Root`", "11 direct subtypes", "at most 10"],
    );

    // The limit is on subtypes: 11 top-level types are fine.
    let tops = names("Top", 11);
    let ok = ontology(&entities(&tops));
    assert_eq!(ok.entity_tree.top_level().count(), 11);

    // Edge hierarchies have the same limit.
    let children: Vec<String> = (0..11).map(|i| format!("SUB_{i}")).collect();
    let mut body = edge("ROOT");
    for c in &children {
        body.push_str(&edge(c));
    }
    body.push_str(&edge_hierarchy(&format!("ROOT = {}", leaves(&children))));
    let issue = only_issue(&body);
    assert_issue(
        &issue,
        "ontology.edge_type_hierarchy.ROOT",
        &["`ROOT`", "11 direct subtypes", "at most 10"],
    );
}

// ---------------------------------------------------------------------------
// 4. At most 4 subtype levels below a top-level type.

fn chain_of(levels_below_top: usize) -> String {
    let chain = names("L", levels_below_top + 1);
    format!(
        "{}{}",
        entities(&chain),
        entity_hierarchy(&chain_line(&chain))
    )
}

#[test]
fn at_most_four_subtype_levels() {
    let ok = ontology(&chain_of(4));
    let deepest = ok.entity_tree.get("L4").unwrap();
    assert_eq!(deepest.depth, 5);
    assert_eq!(deepest.parent.as_deref(), Some("L3"));
    assert_eq!(
        ok.labels_for("L4").unwrap(),
        s(&["Entity", "L0", "L1", "L2", "L3", "L4"])
    );

    let issue = only_issue(&chain_of(5));
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.L0.L1.L2.L3.L4.L5",
        &["`L5`", "5 subtype levels", "at most 4"],
    );
}

// ---------------------------------------------------------------------------
// 5. At most 100 entity types.

#[test]
fn at_most_one_hundred_entity_types() {
    // 100 pass, subtypes included: 10 parents with 9 subtypes each.
    let mut body = String::new();
    let mut lines = Vec::new();
    for p in 0..10 {
        let parent = format!("P{p}");
        let children = names(&format!("P{p}C"), 9);
        body.push_str(&entity(&parent));
        body.push_str(&entities(&children));
        lines.push(format!("{parent} = {}", leaves(&children)));
    }
    let ok = ontology(&format!("{body}{}", entity_hierarchy(&lines.join("\n"))));
    assert_eq!(ok.entity_types.len(), 100);
    assert_eq!(ok.entity_tree.len(), 100);

    let issue = only_issue(&entities(&names("T", 101)));
    assert_issue(
        &issue,
        "ontology.entity_types",
        &["101 entity types", "at most 100", "subtypes included"],
    );
}

// ---------------------------------------------------------------------------
// 6. Unique names.

#[test]
fn entity_type_names_are_unique() {
    let issue = only_issue(&entities(&["Person", "Company", "Person"]));
    assert_issue(
        &issue,
        "ontology.entity_types[2] (Person)",
        &["duplicate entity type", "`Person`"],
    );
}

#[test]
fn edge_type_names_are_unique() {
    let issue = only_issue(&format!(
        "{}{}{}",
        edge("KNOWS"),
        edge("KNOWS"),
        edge("LIKES")
    ));
    assert_issue(
        &issue,
        "ontology.edge_types[1] (KNOWS)",
        &["duplicate edge type", "`KNOWS`"],
    );
}

#[test]
fn property_names_are_unique_within_a_type() {
    let issue = only_issue(&entity_with(
        "Person",
        "properties = [{ name = \"email\", type = \"text\" }, { name = \"role\", type = \"text\" }, { name = \"email\", type = \"int\" }]",
    ));
    assert_issue(
        &issue,
        "ontology.entity_types[0] (Person).properties[2]",
        &["duplicate property", "`email`"],
    );

    let issue = only_issue(&edge_with(
        "PAID",
        "properties = [{ name = \"amount\", type = \"float\" }, { name = \"amount\", type = \"float\" }]",
    ));
    assert_issue(
        &issue,
        "ontology.edge_types[0] (PAID).properties[1]",
        &["duplicate property", "`amount`"],
    );

    // The same property name on two types is fine (no inheritance).
    ontology(&format!(
        "{}{}{}",
        entity_with(
            "Contract",
            "properties = [{ name = \"details\", type = \"text\" }]"
        ),
        entity_with(
            "MSA",
            "properties = [{ name = \"details\", type = \"text\" }]"
        ),
        entity_hierarchy("Contract = { MSA = {} }"),
    ));
}

// ---------------------------------------------------------------------------
// 7. Reserved names.

#[test]
fn entity_is_a_reserved_type_name() {
    let issue = only_issue(&entities(&["Person", "Entity"]));
    assert_issue(
        &issue,
        "ontology.entity_types[1] (Entity)",
        &["`Entity` is reserved", "every node"],
    );
}

#[test]
fn entity_properties_must_not_shadow_node_columns() {
    for column in ["name", "labels", "summary", "created_at", "group_id"] {
        let issue = only_issue(&format!(
            "{}{}",
            entity("Other"),
            entity_with(
                "Person",
                &format!(
                    "properties = [{{ name = \"role\", type = \"text\" }}, {{ name = \"{column}\", type = \"text\" }}]"
                ),
            )
        ));
        assert_issue(
            &issue,
            "ontology.entity_types[1] (Person).properties[1]",
            &[&format!("`{column}` is reserved"), "built-in column"],
        );
    }
    // Edge columns are not node columns: `fact` is a fine entity property.
    ontology(&entity_with(
        "Claim",
        "properties = [{ name = \"fact\", type = \"text\" }]",
    ));
}

#[test]
fn edge_properties_must_not_shadow_edge_columns() {
    for column in ["fact", "valid_at", "invalid_at", "relation_type"] {
        let issue = only_issue(&edge_with(
            "PAID",
            &format!("properties = [{{ name = \"{column}\", type = \"date\" }}]"),
        ));
        assert_issue(
            &issue,
            "ontology.edge_types[0] (PAID).properties[0]",
            &[&format!("`{column}` is reserved"), "built-in column"],
        );
    }
    // Node columns are not edge columns: `summary` is a fine edge property.
    ontology(&edge_with(
        "PAID",
        "properties = [{ name = \"summary\", type = \"text\" }]",
    ));
}

// ---------------------------------------------------------------------------
// 8. source_targets name declared entity types; `Entity` means any.

#[test]
fn source_targets_must_name_declared_entity_types() {
    let issue = only_issue(&format!(
        "{}{}",
        entities(&["Person", "Company"]),
        edge_with(
            "WORKS_AT",
            "source_targets = [{ source = \"Person\", target = \"Company\" }, { source = \"Person\", target = \"Employer\" }]",
        ),
    ));
    assert_issue(
        &issue,
        "ontology.edge_types[0] (WORKS_AT).source_targets[1].target",
        &["`Employer`", "not a declared entity type"],
    );

    let issue = only_issue(&format!(
        "{}{}",
        entity("Company"),
        edge_with(
            "WORKS_AT",
            "source_targets = [{ source = \"Human\", target = \"Company\" }]"
        ),
    ));
    assert_issue(
        &issue,
        "ontology.edge_types[0] (WORKS_AT).source_targets[0].source",
        &["`Human`", "not a declared entity type"],
    );
}

#[test]
fn entity_in_source_targets_means_any_type() {
    let ok = ontology(&format!(
        "{}{}",
        entities(&["Person", "Company", "Product"]),
        edge_with(
            "MENTIONS",
            "source_targets = [{ source = \"Entity\", target = \"Company\" }]"
        ),
    ));
    assert!(ok.edge_allows("MENTIONS", "Person", "Company"));
    assert!(ok.edge_allows("MENTIONS", "Product", "Company"));
    assert!(ok.edge_allows("MENTIONS", "Entity", "Company"));
    assert!(!ok.edge_allows("MENTIONS", "Person", "Product"));
}

// ---------------------------------------------------------------------------
// 9. identity_properties name the type's own properties.

#[test]
fn identity_properties_must_be_own_properties() {
    let issue = only_issue(&entity_with(
        "Person",
        "properties = [{ name = \"email\", type = \"text\" }]\nidentity_properties = [\"email\", \"ssn\"]",
    ));
    assert_issue(
        &issue,
        "ontology.entity_types[0] (Person).identity_properties[1]",
        &["identity property `ssn`", "not a property of `Person`"],
    );

    // Declared only on the parent: properties are not inherited.
    let issue = only_issue(&format!(
        "{}{}{}",
        entity_with(
            "Contract",
            "properties = [{ name = \"number\", type = \"text\" }]\nidentity_properties = [\"number\"]",
        ),
        entity_with(
            "PurchaseOrder",
            "properties = [{ name = \"amount\", type = \"float\" }]\nidentity_properties = [\"number\"]",
        ),
        entity_hierarchy("Contract = { PurchaseOrder = {} }"),
    ));
    assert_issue(
        &issue,
        "ontology.entity_types[1] (PurchaseOrder).identity_properties[0]",
        &[
            "identity property `number`",
            "not a property of `PurchaseOrder`",
            "not inherited",
        ],
    );
}

// ---------------------------------------------------------------------------
// 10. Edge type names and descriptions.

#[test]
fn edge_type_names_are_screaming_snake_case() {
    for bad in [
        "worksFor",
        "WorksFor",
        "works_for",
        "Works_For",
        "WORKS-FOR",
        "WORKS FOR",
        "1_WORKS_FOR",
        "_WORKS_FOR",
        "",
    ] {
        let issue = only_issue(&edge(bad));
        assert_issue(
            &issue,
            &format!("ontology.edge_types[0] ({bad})"),
            &[&format!("{bad:?}"), "SCREAMING_SNAKE_CASE"],
        );
    }
    for good in ["A", "WORKS_FOR", "HAS_2_PARTS", "X9"] {
        ontology(&edge(good));
    }
}

#[test]
fn descriptions_must_not_be_empty() {
    let issue =
        only_issue("[[ontology.entity_types]]\nname = \"Person\"\ndescription = \"  \\n\"\n");
    assert_issue(
        &issue,
        "ontology.entity_types[0] (Person)",
        &["description is empty", "membership rule"],
    );

    let issue = only_issue("[[ontology.edge_types]]\nname = \"KNOWS\"\ndescription = \"\"\n");
    assert_issue(
        &issue,
        "ontology.edge_types[0] (KNOWS)",
        &["description is empty", "when the type applies"],
    );

    // A missing description is a parse error naming the field.
    let error = spec_error("[[ontology.entity_types]]\nname = \"Person\"\n");
    assert!(matches!(error, SpecError::Parse { .. }), "{error:?}");
    assert_mentions(&error, &["description"]);
}

// ---------------------------------------------------------------------------
// 11. Every issue is reported at once.

#[test]
fn every_issue_is_reported_at_once() {
    let body = format!(
        "{}{}{}{}{}{}{}",
        entity("Entity"),                                           // 1 reserved
        entity_with("Person", "identity_properties = [\"email\"]"), // 2 identity
        entity("Person"),                                           // 3 duplicate
        edge("worksFor"),                                           // 4 case
        edge_with(
            "OWNS",
            "source_targets = [{ source = \"Person\", target = \"Asset\" }]" // 5 target
        ),
        entity_hierarchy("Person = { Ghost = {} }"), // 6 undeclared
        edge_hierarchy("OWNS = { LEASES = {} }"),    // 7 undeclared
    );
    let all = issues(&body);
    let paths: Vec<&str> = all.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "ontology.entity_types[0] (Entity)",
            "ontology.entity_types[1] (Person).identity_properties[0]",
            "ontology.entity_types[2] (Person)",
            "ontology.edge_types[0] (worksFor)",
            "ontology.edge_types[1] (OWNS).source_targets[0].target",
            "ontology.entity_type_hierarchy.Person.Ghost",
            "ontology.edge_type_hierarchy.OWNS.LEASES",
        ],
        "{all:#?}"
    );
    assert_eq!(all.len(), 7);

    let rendered = OntologyError::Invalid(all).to_string();
    assert!(
        rendered.starts_with("invalid ontology (7 errors):"),
        "{rendered}"
    );
    assert_eq!(rendered.lines().count(), 8, "{rendered}");
}

// ---------------------------------------------------------------------------
// Spec-level checks.

#[test]
fn unknown_keys_are_rejected_by_name() {
    let error = spec_error("[llm]\ntokens_per_minit = 5000\n");
    assert!(matches!(error, SpecError::Parse { .. }), "{error:?}");
    assert_mentions(&error, &["tokens_per_minit", "rules.toml"]);

    let error = PipelineSpec::from_toml(
        "[output]\ngrahp = \"file:///tmp/g\"\n",
        Path::new("rules.toml"),
    )
    .expect_err("`grahp` is a typo");
    assert!(matches!(error, SpecError::Parse { .. }), "{error:?}");
    assert_mentions(&error, &["grahp"]);

    let error = spec_error(&entity_with("Person", "identity_property = [\"email\"]"));
    assert!(matches!(error, SpecError::Parse { .. }), "{error:?}");
    assert_mentions(&error, &["identity_property"]);

    let error = spec_error(&entity_with(
        "Person",
        "properties = [{ name = \"email\", type = \"text\", required = true }]",
    ));
    assert_mentions(&error, &["required"]);

    let error = spec_error("[ontology]\nstrickt = true\n");
    assert_mentions(&error, &["strickt"]);

    let error = spec_error(&edge_with(
        "KNOWS",
        "source_targets = [{ source = \"Entity\", targets = \"Entity\" }]",
    ));
    assert_mentions(&error, &["targets"]);
}

#[test]
fn resolve_settings_are_checked_by_key() {
    let error = spec_error("[resolve]\ngrey_band_min = 0.9\nfuzzy_merge_threshold = 0.8\n");
    assert_mentions(&error, &["resolve.grey_band_min", "fuzzy_merge_threshold"]);
    let error = spec_error("[resolve]\nlsh_bands = 0\n");
    assert_mentions(&error, &["resolve.lsh_bands"]);
    let error = spec_error("[resolve]\nduplicate_fact_similarity = 1.5\n");
    assert_mentions(
        &error,
        &["resolve.duplicate_fact_similarity", "between 0 and 1"],
    );
    let error = spec_error("[resolve]\nadjudcate = false\n");
    assert_mentions(&error, &["adjudcate"]);
    let ok = spec("[resolve]\nadjudicate = false\ncorporate_suffixes = [\"kg\"]\n");
    assert!(!ok.resolve.adjudicate);
    assert_eq!(ok.resolve.corporate_suffixes, vec!["kg".to_string()]);
    assert!(ok.resolve.fuzzy, "unset keys keep their defaults");
}

#[test]
fn unknown_property_type_names_the_allowed_kinds() {
    let error = spec_error(&entity_with(
        "Person",
        "properties = [{ name = \"email\", type = \"string\" }]",
    ));
    assert!(matches!(error, SpecError::Parse { .. }), "{error:?}");
    assert_mentions(&error, &["string", "text", "int", "float", "bool", "date"]);
}

#[test]
fn llm_budgets_must_be_positive() {
    for key in [
        "requests_per_minute",
        "tokens_per_minute",
        "max_concurrency",
    ] {
        let error = spec_error(&format!("[llm]\n{key} = 0\n"));
        match &error {
            SpecError::Value {
                key: k, message, ..
            } => {
                assert_eq!(k, &format!("llm.{key}"));
                assert!(message.contains("at least 1"), "{message}");
            }
            other => panic!("expected a value error for {key}, got {other:?}"),
        }
        assert_mentions(&error, &[&format!("`llm.{key}`"), "at least 1"]);
    }
    // 1 is the smallest budget allowed.
    let ok = spec("[llm]\nrequests_per_minute = 1\n");
    assert_eq!(ok.llm.requests_per_minute, 1);
}

#[test]
fn api_key_env_must_name_a_variable_not_hold_a_key() {
    let secret = "sk-proj-AbCdEf0123456789";
    let error = spec_error(&format!("[llm]\napi_key_env = \"{secret}\"\n"));
    match &error {
        SpecError::Value { key, message, .. } => {
            assert_eq!(key, "llm.api_key_env");
            assert!(message.contains("looks like an API key"), "{message}");
        }
        other => panic!("expected a value error, got {other:?}"),
    }
    // The key itself never appears in the message.
    assert!(!error.to_string().contains(secret), "{error}");
    assert!(!format!("{error:?}").contains(secret), "{error:?}");

    let ok = spec("[llm]\napi_key_env = \"MY_PROVIDER_KEY\"\n");
    assert_eq!(ok.llm.api_key_env, "MY_PROVIDER_KEY");
}

// ---------------------------------------------------------------------------
// The example pipeline and what a valid ontology answers.

#[test]
fn procurement_example_is_valid() {
    let spec = PipelineSpec::from_path(&procurement_path()).expect("example spec parses");
    let onto = Ontology::try_from(&spec.ontology).expect("example ontology is valid");

    assert_eq!(
        onto.labels_for("PurchaseOrder").unwrap(),
        s(&["Entity", "Contract", "PurchaseOrder"])
    );
    assert_eq!(onto.labels_for("Person").unwrap(), s(&["Entity", "Person"]));
    assert_eq!(onto.labels_for("Entity").unwrap(), s(&["Entity"]));
    assert_eq!(onto.labels_for("Invoice"), None);

    let closure = onto.entity_tree.closure();
    let row = |a: &str, d: &str, n: i32| (a.to_string(), d.to_string(), n);
    assert!(closure.contains(&row("Contract", "PurchaseOrder", 1)));
    assert!(closure.contains(&row("PurchaseOrder", "PurchaseOrder", 0)));
    assert!(
        !closure
            .iter()
            .any(|(a, d, _)| a == "PurchaseOrder" && d == "Contract")
    );
    // One self row per type plus one row per parent link.
    assert_eq!(closure.len(), 7 + 3);

    assert!(onto.edge_allows("WORKS_FULL_TIME_FOR", "Person", "Company"));
    assert!(!onto.edge_allows("WORKS_FULL_TIME_FOR", "Company", "Person"));
    // A PurchaseOrder is a Contract, so it may be the target of PARTY_TO.
    assert!(onto.edge_allows("PARTY_TO", "Company", "PurchaseOrder"));
    assert!(!onto.edge_allows("PARTY_TO", "Company", "Product"));

    assert!(onto.entity_fits("PurchaseOrder", "Contract"));
    assert!(!onto.entity_fits("Contract", "PurchaseOrder"));
    assert!(onto.entity_fits("Product", "Entity"));

    assert_eq!(
        onto.edge_tree
            .get("CONTRACTS_FOR")
            .unwrap()
            .parent
            .as_deref(),
        Some("EMPLOYED_BY")
    );
    assert_eq!(
        onto.entity_tree.render(),
        "Person\nCompany\nProduct\nContract\n├── MSA\n├── OrderForm\n└── PurchaseOrder\n"
    );
}

#[test]
fn render_keeps_declared_order_for_tops_and_hierarchy_order_for_subtypes() {
    // Declared: Vehicle before Animal, Truck before Car. Written hierarchy:
    // Animal before Vehicle, Car before Truck.
    let onto = ontology(&format!(
        "{}{}",
        entities(&[
            "Vehicle",
            "Truck",
            "Car",
            "SportsCar",
            "Animal",
            "Dog",
            "Cat",
            "Plant",
        ]),
        entity_hierarchy(
            "Animal = { Dog = {}, Cat = {} }\nVehicle = { Car = { SportsCar = {} }, Truck = {} }"
        ),
    ));
    assert_eq!(
        onto.entity_tree.render(),
        "Vehicle\n\
         ├── Car\n\
         │   └── SportsCar\n\
         └── Truck\n\
         Animal\n\
         ├── Dog\n\
         └── Cat\n\
         Plant\n"
    );
    let order: Vec<&str> = onto.entity_tree.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        order,
        [
            "Vehicle",
            "Car",
            "SportsCar",
            "Truck",
            "Animal",
            "Dog",
            "Cat",
            "Plant"
        ]
    );
}

#[test]
fn declared_type_missing_from_hierarchy_is_a_top_level_leaf() {
    let onto = ontology(&format!(
        "{}{}",
        entities(&["Contract", "PurchaseOrder", "Person"]),
        entity_hierarchy("Contract = { PurchaseOrder = {} }"),
    ));
    let person = onto
        .entity_tree
        .get("Person")
        .expect("Person is in the tree");
    assert_eq!(person.parent, None);
    assert_eq!(person.depth, 1);
    assert!(person.children.is_empty());
    assert_eq!(onto.labels_for("Person").unwrap(), s(&["Entity", "Person"]));
    let tops: Vec<&str> = onto
        .entity_tree
        .top_level()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(tops, ["Contract", "Person"]);

    // With no hierarchy at all every type is top level, edges included.
    let onto = ontology(&format!("{}{}", entities(&["A", "B"]), edge("KNOWS")));
    assert_eq!(onto.entity_tree.top_level().count(), 2);
    assert_eq!(onto.edge_tree.get("KNOWS").unwrap().depth, 1);
}

#[test]
fn origin_and_case_variants_of_columns_are_reserved() {
    let issue = only_issue(&entity_with(
        "Person",
        r#"properties = [{ name = "origin", type = "text" }]"#,
    ));
    assert_mentions_issue(&issue, &["`origin` is reserved"]);
    let issue = only_issue(&entity_with(
        "Person",
        r#"properties = [{ name = "Name", type = "text" }]"#,
    ));
    assert_mentions_issue(&issue, &["`Name` is reserved"]);
    let issue = only_issue(&edge_with(
        "KNOWS",
        r#"properties = [{ name = "origin", type = "text" }]"#,
    ));
    assert_mentions_issue(&issue, &["`origin` is reserved"]);
    let issue = only_issue(&entity("ENTITY"));
    assert_mentions_issue(&issue, &["reserved"]);
}

fn assert_mentions_issue(issue: &OntologyIssue, words: &[&str]) {
    for word in words {
        assert!(
            issue.message.contains(word),
            "{issue} should mention {word:?}"
        );
    }
}

#[test]
fn entity_as_a_hierarchy_root_gets_its_own_message() {
    let body = format!(
        "{}{}",
        entity("Person"),
        entity_hierarchy("Entity = { Person = {} }")
    );
    let issue = only_issue(&body);
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.Entity",
        &["built in", "cannot appear in a hierarchy"],
    );
}

#[test]
fn an_undeclared_key_names_the_subtypes_it_leaves_unplaced() {
    let body = format!(
        "{}{}{}",
        entity("A"),
        entity("B"),
        entity_hierarchy("Ghost = { A = { B = {} } }")
    );
    let issue = only_issue(&body);
    assert_issue(
        &issue,
        "ontology.entity_type_hierarchy.Ghost",
        &[
            "not a declared entity type",
            "its subtypes A are not placed",
        ],
    );
}

#[test]
fn identity_properties_are_listed_once() {
    let issue = only_issue(&entity_with(
        "Person",
        "properties = [{ name = \"email\", type = \"text\" }]\nidentity_properties = [\"email\", \"email\"]",
    ));
    assert_issue(
        &issue,
        "ontology.entity_types[0] (Person).identity_properties[1]",
        &["duplicate identity property `email`"],
    );
}

#[test]
fn a_key_pasted_into_the_wrong_field_is_not_echoed() {
    let secret = "sk-proj-SECRET123";
    let err = spec_error(&format!("[llm]\napi_key = \"{secret}\"\n"));
    let shown = format!("{err} {err:?}");
    assert!(
        shown.contains("api_key"),
        "the unknown key is named: {shown}"
    );
    assert!(
        shown.contains("line ") && shown.contains("column 1"),
        "the position is given: {shown}"
    );
    assert!(
        !shown.contains(secret),
        "the value must not be echoed: {shown}"
    );
    // Nor when it lands under a key of another type: serde's messages quote
    // the value they refused.
    for (line, words) in [
        ("requests_per_minute", "invalid type: string, expected u32"),
        ("api_style", "unknown variant, expected `openai` or `azure`"),
        ("extra_body", "invalid type: string, expected a map"),
    ] {
        let err = spec_error(&format!("[llm]\n{line} = \"{secret}\"\n"));
        let shown = format!("{err} {err:?}");
        assert!(
            shown.contains("line ") && shown.contains(", column "),
            "{shown}"
        );
        assert!(shown.contains(words), "{shown}");
        assert!(!shown.contains("SECRET123"), "value echoed: {shown}");
    }
    // Short plain values are still shown: they help.
    let err = spec_error("[llm]\nrequests_per_minute = \"600\"\n");
    assert!(
        err.to_string()
            .contains("invalid type: string \"600\", expected u32"),
        "{err}"
    );
    for value in [" sk-proj-SECRET", "gsk_abcdef", "not a name!"] {
        let err = spec_error(&format!("[llm]\napi_key_env = \"{value}\"\n"));
        let shown = format!("{err} {err:?}");
        assert!(shown.contains("llm.api_key_env"), "{shown}");
        assert!(!shown.contains(value.trim()), "value echoed: {shown}");
    }
}
