use serde_json::{Map, Value, json};

use super::entities::*;
use super::evidence::*;
use super::facts::*;
use super::fit::*;
use super::prompt::*;
use super::record::*;
use super::reply::*;
use super::times::*;
use super::types::*;
use super::*;
use crate::cues::roles::is_role_word;
use crate::ontology::{Ontology, PropertySpec, PropertyType};
use crate::values::parse_time;

#[test]
fn relation_types_become_screaming_snake_case() {
    assert_eq!(relation_type_of("works for"), "WORKS_FOR");
    assert_eq!(relation_type_of("signed-by"), "SIGNED_BY");
    assert_eq!(relation_type_of("EMPLOYED_BY"), "EMPLOYED_BY");
    assert_eq!(relation_type_of("3rd party of"), "R_3RD_PARTY_OF");
    assert_eq!(relation_type_of("  "), "");
}

/// The ontology of an `[ontology]` table's TOML.
fn ontology(text: &str) -> Ontology {
    let spec: crate::ontology::OntologySpec = toml::from_str(text).expect("ontology spec");
    Ontology::try_from(&spec).expect("valid ontology")
}

fn hr() -> Ontology {
    ontology(
        r#"
        [[entity_types]]
        name = "Person"
        description = "A person."
        [[entity_types]]
        name = "Company"
        description = "A company."
        [[entity_types]]
        name = "Team"
        description = "A team."
        [[edge_types]]
        name = "WORKS_FOR"
        description = "Works for a company."
        source_targets = [{ source = "Person", target = "Company" }]
        [[edge_types]]
        name = "CONTRACTS_FOR"
        description = "Works for a company under contract."
        source_targets = [{ source = "Person", target = "Company" }]
        [[edge_types]]
        name = "RESPONSIBLE_FOR"
        description = "Answers for something."
        source_targets = [{ source = "Person", target = "Team" }, { source = "Team", target = "Company" }]
        [edge_type_hierarchy]
        WORKS_FOR = { CONTRACTS_FOR = {} }
        "#,
    )
}

#[test]
fn each_entity_type_offers_only_its_own_optional_properties() {
    let ontology = ontology(
        r#"
        [[entity_types]]
        name = "Person"
        description = "A person."
        properties = [
          { name = "email", type = "text", pattern = '^[^@ ]{1,64}@[^@ ]{1,64}$' },
          { name = "title", type = "text" },
        ]
        [[entity_types]]
        name = "Company"
        description = "A company."
        properties = [{ name = "domain", type = "text" }]
        [[entity_types]]
        name = "Team"
        description = "A team."
        "#,
    );
    let schema = entity_schema(&ontology, &ExtractSpec::default());
    let shapes = schema["properties"]["entities"]["items"]["anyOf"]
        .as_array()
        .expect("one shape per type");
    let of = |t: &str| {
        shapes
            .iter()
            .find(|s| s["properties"]["type"]["enum"] == json!([t]))
            .unwrap_or_else(|| panic!("no shape for {t}"))
    };
    let person = &of("Person")["properties"]["attributes"];
    let keys: Vec<&String> = person["properties"]
        .as_object()
        .expect("keys")
        .keys()
        .collect();
    assert_eq!(keys, ["email", "title"]);
    assert!(
        person.get("required").is_none(),
        "every property is optional"
    );
    assert_eq!(
        person["properties"]["email"]["pattern"],
        json!("^[^@ ]{1,64}@[^@ ]{1,64}$")
    );
    assert_eq!(
        person["properties"]["title"]["maxLength"],
        json!(VALUE_MAX_CHARS)
    );
    let company = &of("Company")["properties"]["attributes"]["properties"];
    assert_eq!(company.as_object().map(|o| o.len()), Some(1));
    // A type without properties, and the generic Entity, have no
    // attributes to fill in; no shape requires them.
    assert!(of("Team")["properties"].get("attributes").is_none());
    assert!(of(ENTITY_LABEL)["properties"].get("attributes").is_none());
    for s in shapes {
        assert_eq!(s["required"], json!(["name", "type"]));
    }
}

#[test]
fn asked_properties_narrow_what_the_entity_call_offers_and_describes() {
    let ontology = ontology(
        r#"
        [[entity_types]]
        name = "Person"
        description = "A person."
        properties = [
          { name = "email", type = "text", description = "Mail address." },
          { name = "title", type = "text", description = "Job title." },
        ]
        identity_properties = ["email"]
        [[entity_types]]
        name = "Company"
        description = "A company."
        properties = [{ name = "industry", type = "text" }]
        "#,
    );
    let offered = |asked: AskedProperties| {
        let spec = ExtractSpec {
            properties: asked,
            ..ExtractSpec::default()
        };
        let schema = entity_schema(&ontology, &spec);
        let mut keys: Vec<String> = Vec::new();
        for shape in schema["properties"]["entities"]["items"]["anyOf"]
            .as_array()
            .expect("shapes")
        {
            if let Some(props) = shape["properties"]["attributes"]["properties"].as_object() {
                keys.extend(props.keys().cloned());
            }
        }
        let prompt = system_prompt(&ontology, &spec);
        let task = entity_task(&spec);
        (
            keys,
            prompt.contains("title (text)"),
            task.contains("attributes"),
        )
    };
    assert_eq!(
        offered(AskedProperties::All),
        (
            vec!["email".into(), "title".into(), "industry".into()],
            true,
            true
        )
    );
    assert_eq!(
        offered(AskedProperties::Identity),
        (vec!["email".into()], false, true)
    );
    assert_eq!(offered(AskedProperties::None), (Vec::new(), false, false));
}

#[test]
fn an_identity_value_belongs_to_the_name_written_nearest_to_it() {
    let ontology = ontology(
        r#"
        [[entity_types]]
        name = "Person"
        description = "A person."
        properties = [{ name = "email", type = "text" }, { name = "role", type = "text" }]
        identity_properties = ["email"]
        "#,
    );
    let content = "From: Priya Raman <priya@acme.example>\n\
                   To: Dana Whitcombe <dana@northwind.example>\n\
                   Cc: Felix <felix@northwind.example>\n\nHi Dana, see below.\n\
                   Grace Adeyemi <grace.adeyemi@acme.example>, VP at Acme\n\
                   Signed, D. Whitcombe";
    let person = |name: &str, email: &str| Mention {
        episode_id: "e".into(),
        name: name.into(),
        chain: vec!["Person".into()],
        attributes: serde_json::from_value(json!({"email": email, "role": "buyer"})).expect("map"),
        context: String::new(),
        mapped: false,
    };
    let mut mentions = vec![
        // Dana's address copied onto Priya: taken off.
        person("Priya Raman", "dana@northwind.example"),
        // Her own: kept.
        person("Dana Whitcombe", "dana@northwind.example"),
        // Not written in this episode (a context episode's): kept.
        person("Felix", "felix@old.example"),
        // The name as given is not written: nothing to measure, kept.
        person("Felix Oyelaran", "felix@northwind.example"),
        // "Acme" inside the address is not a name next to it.
        person("Grace Adeyemi", "grace.adeyemi@acme.example"),
        person("Acme", ""),
        // A domain written only inside addresses is not judged.
        person("Northwind", "northwind.example"),
        // Nearest to "Dana Whitcombe", but sharing her surname: may be
        // her, left to resolution.
        person("D. Whitcombe", "dana@northwind.example"),
        // A value written as the name itself is the mention's own.
        person("priya@acme.example", "priya@acme.example"),
    ];
    let taken = misplaced_identity_values(
        &ontology,
        &content.to_lowercase(),
        &mut mentions,
        &crate::cues::Switches::default(),
    );
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].0, 0);
    assert!(taken[0].1.contains("next to `Dana Whitcombe`"), "{taken:?}");
    assert!(mentions[0].attributes.get("email").is_none());
    assert_eq!(mentions[0].attributes["role"], "buyer", "other values stay");
    for m in &mentions[1..] {
        assert!(m.attributes.get("email").is_some(), "{}", m.name);
    }
}

#[test]
fn a_one_word_role_the_type_descriptions_write_in_lower_case_is_not_a_name() {
    let onto = ontology(
        r#"
        [[entity_types]]
        name = "Company"
        description = "A business such as a customer or a supplier, e.g. Globex."
        [[edge_types]]
        name = "EMPLOYS"
        description = "A company employs a person."
        "#,
    );
    let roles = role_words(&onto);
    for role in ["Customer", "the Supplier", "PERSON"] {
        assert!(is_role_word(&roles, role), "{role}");
    }
    // An example name, a longer name holding a role, or a word the
    // descriptions do not use.
    for name in ["Globex", "Customer Success Team", "Acme"] {
        assert!(!is_role_word(&roles, name), "{name}");
    }
}

#[test]
fn the_types_of_people_are_found_by_name_or_description_with_their_subtypes() {
    let onto = ontology(
        r#"
        [[entity_types]]
        name = "Staffer"
        description = "A named individual. Not a team."
        [[entity_types]]
        name = "Engineer"
        description = "Writes code."
        [[entity_types]]
        name = "Contact"
        description = "Someone we write to."
        [[entity_types]]
        name = "Team"
        description = "A group of engineers. Not a person."
        [[entity_types]]
        name = "Product"
        description = "A thing we sell, e.g. Secrets Manager."
        [entity_type_hierarchy]
        Staffer = { Engineer = {} }
        "#,
    );
    let people = person_types(&onto);
    let mut found: Vec<&str> = people.iter().map(String::as_str).collect();
    found.sort_unstable();
    // "Not a person" is in Team's second sentence, not its first.
    assert_eq!(found, ["Contact", "Engineer", "Staffer"]);
}

#[test]
fn a_type_written_as_words_is_a_type_word() {
    assert_eq!(type_word("Order Form"), type_word("OrderForm"));
    assert_eq!(type_word("purchase-order"), type_word("PurchaseOrder"));
    assert_ne!(type_word("Order Form OF-601"), type_word("OrderForm"));
    let onto = ontology(
        r#"
        [[entity_types]]
        name = "MSA"
        description = "A master services agreement."
        [[entity_types]]
        name = "OrderForm"
        description = "An order form."
        [[entity_types]]
        name = "Team"
        description = "A team."
        "#,
    );
    let words = TypeWords::new(&onto);
    let is_type = |name: &str| words.spelled_by(name);
    assert!(
        is_type("Master Services Agreement"),
        "an acronym type spelled out"
    );
    assert!(is_type("order form"));
    assert!(!is_type("Acme MSA"));
    assert!(!is_type("Mutual Supply Addendum 2"), "a name with a number");
    assert!(!is_type("Maria Santos"), "initials that spell no type");
    assert!(
        !is_type("Tidewell East Asia Markets"),
        "initials match acronym types only"
    );
    assert!(is_type("OF"), "the initials of a type of two words");
    assert!(is_type("OFs"));
    assert!(!is_type("Of"), "initials are written in capitals");
    assert!(!is_type("T"), "a type of one word has no initials");
    let typed = |name: &'static str| words.type_and_code(name);
    assert_eq!(
        typed("order form AOF-2024-031"),
        Some(("OrderForm", "AOF-2024-031"))
    );
    assert_eq!(typed("ORDER FORM OF-601."), Some(("OrderForm", "OF-601")));
    assert_eq!(typed("MSA M-2024-1"), Some(("MSA", "M-2024-1")));
    assert_eq!(typed("order form 2024"), None, "a number is not a code");
    assert_eq!(typed("Acme order form OF-601"), None, "more than a type");
    assert_eq!(typed("Ridgeback 14"), None);
    assert_eq!(typed("OF-601"), None, "a code alone");
    let before = |code: &str, text: &str| words.written_before(code, text);
    assert_eq!(
        before(
            "QF-0087",
            "Thank you for signing order form QF-0087 yesterday!"
        ),
        Some("OrderForm")
    );
    assert_eq!(
        before(
            "QF-0087",
            "Quillfeather Software. ORDER FORM QF-0087. Customer: …"
        ),
        Some("OrderForm"),
        "in capitals, the code at a sentence's end"
    );
    assert_eq!(
        before("M-2024-1", "Under M-2024-1; see MSA M-2024-1."),
        Some("MSA"),
        "a place that writes no type does not count"
    );
    assert_eq!(
        before("X-12", "order form X-12 replaces MSA X-12"),
        None,
        "two types for one code"
    );
    assert_eq!(
        before("OF-601", "the order form OF-6012"),
        None,
        "another code"
    );
    assert_eq!(
        before("OF-601", "order form:OF-601"),
        None,
        "not right before it"
    );
    assert_eq!(before("OF-601", "We signed OF-601."), None);
    assert_eq!(
        words.introduced_codes(
            "ORDER FORM AOF-2024-031. It falls under MSA M-2024-1, not order \
             form X-12 or MSA X-12; see AOF-2024-031 and PO-77."
        ),
        [("AOF-2024-031", "OrderForm"), ("M-2024-1", "MSA")],
        "each code once; none where two types disagree or none is written"
    );
}

#[test]
fn attributes_parse_as_an_object_or_as_name_value_pairs() {
    let object: EntityOut = serde_json::from_str(
        r#"{"name": "Dana", "type": "Person", "attributes": {"title": "CFO", "email": null}}"#,
    )
    .expect("object form");
    let pairs = object.attributes.pairs();
    assert_eq!(pairs.len(), 1);
    assert_eq!(
        (pairs[0].name.as_str(), pairs[0].value.as_str()),
        ("title", "CFO")
    );
    let list: EntityOut = serde_json::from_str(
        r#"{"name": "Dana", "type": "Person", "attributes": [{"name": "title", "value": "CFO"}]}"#,
    )
    .expect("list form");
    assert_eq!(list.attributes.pairs().len(), 1);
    let none: EntityOut =
        serde_json::from_str(r#"{"name": "Dana", "type": "Person"}"#).expect("no attributes");
    assert!(none.attributes.pairs().is_empty());
}

fn mention(name: &str, kind: &str) -> Mention {
    Mention {
        episode_id: "e".into(),
        name: name.into(),
        chain: vec![kind.into()],
        attributes: Map::new(),
        context: String::new(),
        mapped: false,
    }
}

/// (relation, sources, targets) of each branch of a fact item schema.
fn branches(schema: &Value) -> Vec<(String, Vec<String>, Vec<String>)> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    schema["anyOf"]
        .as_array()
        .expect("anyOf")
        .iter()
        .map(|b| {
            let p = &b["properties"];
            let relation = strings(&p["relation_type"]["enum"])
                .pop()
                .unwrap_or_else(|| "(free)".into());
            (
                relation,
                strings(&p["source"]["enum"]),
                strings(&p["target"]["enum"]),
            )
        })
        .collect()
}

#[test]
fn a_fact_schema_offers_a_declared_type_only_for_endpoints_it_allows() {
    let onto = hr();
    let mentions = [
        mention("Dana", "Person"),
        mention("Acme", "Company"),
        mention("Globex", "Company"),
    ];
    let folded = ExtractSpec {
        fold_edge_subtypes: true,
        ..ExtractSpec::default()
    };
    let got = branches(&fact_item_schema(&onto, &folded, &mentions));
    let (dana, companies) = (
        vec!["Dana".to_string()],
        vec!["Acme".to_string(), "Globex".into()],
    );
    let all: Vec<String> = mentions.iter().map(|m| m.name.clone()).collect();
    assert_eq!(
        got,
        vec![
            ("WORKS_FOR".into(), dana.clone(), companies.clone()),
            ("CONTRACTS_FOR".into(), dana, companies),
            // RESPONSIBLE_FOR needs a team on one side: no branch.
            ("(free)".into(), all.clone(), all),
        ]
    );
    let top = ExtractSpec::default();
    let names: Vec<String> = branches(&fact_item_schema(&onto, &top, &mentions))
        .into_iter()
        .map(|b| b.0)
        .collect();
    assert_eq!(
        names,
        ["WORKS_FOR", "(free)"],
        "subtypes are left to the walk"
    );
}

#[test]
fn a_fact_start_read_from_the_text_is_not_asked_of_the_model() {
    let onto = hr();
    let mentions = [mention("Dana", "Person"), mention("Acme", "Company")];
    let keys = |spec: &ExtractSpec| -> Vec<Vec<String>> {
        let schema = fact_item_schema(&onto, spec, &mentions);
        let branches = schema["anyOf"].as_array().expect("branches").clone();
        branches
            .iter()
            .map(|b| {
                let props: Vec<String> = b["properties"]
                    .as_object()
                    .expect("properties")
                    .keys()
                    .cloned()
                    .collect();
                let required: Vec<String> =
                    serde_json::from_value(b["required"].clone()).expect("required");
                assert_eq!(props, required, "every property is required");
                props
            })
            .collect()
    };
    for props in keys(&ExtractSpec::default()) {
        assert!(props.contains(&"valid_at".to_string()), "{props:?}");
    }
    let text = ExtractSpec {
        fact_start: FactStart::Text,
        ..ExtractSpec::default()
    };
    for props in keys(&text) {
        assert_eq!(props, ["source", "relation_type", "target", "fact", "ends"]);
    }
    assert!(fact_task(&onto, &ExtractSpec::default(), false).contains("- valid_at:"));
    assert!(!fact_task(&onto, &text, false).contains("- valid_at:"));
}

#[test]
fn a_fact_without_a_stated_start_starts_at_its_episode_unless_it_had_ended() {
    let reference = parse_time(Some("2025-02-10T09:15:00Z"))
        .expect("time")
        .expect("some");
    let t = |s: &str| parse_time(Some(s)).expect("time").expect("some");
    assert_eq!(default_start(None, reference), Some(reference));
    assert_eq!(
        default_start(Some(t("2025-03-31")), reference),
        Some(reference),
        "ends later: known to hold from the episode on"
    );
    assert_eq!(default_start(Some(reference), reference), None);
    assert_eq!(default_start(Some(t("2024-12-31")), reference), None);
}

#[test]
fn facts_grouped_by_source_offer_only_what_that_entity_can_start() {
    let onto = hr();
    let mentions = [
        mention("Dana", "Person"),
        mention("Acme", "Company"),
        mention("Globex", "Company"),
    ];
    let spec = ExtractSpec::default();
    let dana = fact_branches(&onto, &spec, &mentions, Some(&mentions[0]));
    let shapes: Vec<(String, Vec<String>)> = dana
        .iter()
        .map(|b| {
            let relation = b["properties"]["relation_type"]["enum"][0]
                .as_str()
                .unwrap_or("(free)")
                .to_string();
            let targets = b["properties"]["target"]["enum"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            (relation, targets)
        })
        .collect();
    assert_eq!(
        shapes,
        vec![
            (
                "WORKS_FOR".to_string(),
                vec!["Acme".to_string(), "Globex".into()]
            ),
            (
                "(free)".to_string(),
                vec!["Acme".to_string(), "Globex".into()]
            ),
        ],
        "never itself as a target"
    );
    // The source is the key, not a property; the rest keep their order
    // (a model writes them in schema order: the end date last).
    let keys: Vec<&String> = dana[0]["properties"]
        .as_object()
        .expect("props")
        .keys()
        .collect();
    assert_eq!(
        keys,
        ["relation_type", "target", "fact", "valid_at", "ends"]
    );
    assert_eq!(dana[0]["required"].as_array().map(Vec::len), Some(5));
    // A company starts no declared type here: only the free shape.
    let acme = fact_branches(&onto, &spec, &mentions, Some(&mentions[1]));
    assert_eq!(acme.len(), 1);
    assert!(
        acme[0]["properties"]["relation_type"]
            .get("pattern")
            .is_some()
    );
    // A reply grouped by source reads as facts with their source.
    let reply: FactReply = serde_json::from_value(json!({"facts": {
        "Dana": [{"relation_type": "WORKS_FOR", "target": "Acme", "fact": "Dana works for Acme.",
                  "valid_at": null, "ends": null}, {"target": "Acme"}],
        "Acme": []
    }}))
    .expect("grouped reply");
    let (facts, notes) = reply.facts.into_list();
    assert_eq!(facts.len(), 1);
    assert_eq!(
        (facts[0].source.as_str(), facts[0].target.as_str()),
        ("Dana", "Acme")
    );
    assert_eq!(
        notes.len(),
        1,
        "the item without a fact's shape is noted: {notes:?}"
    );
}

#[test]
fn the_free_relation_cannot_spell_a_declared_type() {
    let re = regex::Regex::new(FREE_RELATION_PATTERN).expect("pattern");
    assert!(re.is_match("works with") && re.is_match("reports to"));
    for declared in ["WORKS_FOR", "Works for", "works_for", ""] {
        assert!(!re.is_match(declared), "{declared}");
    }
    assert!(!re.is_match("a ".repeat(7).trim_end()), "at most six words");
}

#[test]
fn a_relation_spelled_without_underscores_or_in_the_other_voice_is_the_declared_type() {
    let onto = ontology(
        r#"
        [[entity_types]]
        name = "Service"
        description = "A service."
        [[entity_types]]
        name = "Company"
        description = "A company."
        [[entity_types]]
        name = "Team"
        description = "A team."
        [[edge_types]]
        name = "SUPPLIED_BY"
        description = "A service uses a vendor."
        source_targets = [{ source = "Service", target = "Company" }]
        [[edge_types]]
        name = "OWNS"
        description = "A team owns a service."
        source_targets = [{ source = "Team", target = "Service" }]
        "#,
    );
    let cues = crate::cues::Switches::default();
    let read = |r: &str| declared_spelling(&onto, &relation_type_of(r), &cues);
    assert_eq!(read("suppliedby"), Some(("SUPPLIED_BY".into(), false)));
    assert_eq!(read("SuppliedBy"), Some(("SUPPLIED_BY".into(), false)));
    assert_eq!(read("supplied"), Some(("SUPPLIED_BY".into(), true)));
    assert_eq!(read("supplies"), Some(("SUPPLIED_BY".into(), true)));
    assert_eq!(read("owned by"), Some(("OWNS".into(), true)));
    assert_eq!(read("supplied by"), None, "declared as written");
    assert_eq!(read("supplier of"), None, "no declared type spelled");
    assert_eq!(read("owned"), None, "OWNED_BY is not declared");
}

#[test]
fn a_declared_type_that_does_not_fit_keeps_its_fact_under_one_that_does() {
    let onto = hr();
    let fit = |r: &str, s: &str, t: &str| fitting_relation(&onto, r, s, t);
    assert_eq!(
        fit("WORKS_FOR", "Person", "Company"),
        Some(("WORKS_FOR".into(), false))
    );
    assert_eq!(
        fit("WORKS_FOR", "Company", "Person"),
        Some(("WORKS_FOR".into(), true)),
        "a reversed direction is turned round"
    );
    assert_eq!(
        fit("CONTRACTS_FOR", "Company", "Company"),
        Some((GENERIC_RELATION.into(), false)),
        "neither the subtype nor its parent fits"
    );
    assert_eq!(
        fit("RESPONSIBLE_FOR", "Team", "Company"),
        Some(("RESPONSIBLE_FOR".into(), false)),
        "any pair of the list counts"
    );
    assert_eq!(
        fit("WORKS_WITH", "Company", "Company"),
        Some(("WORKS_WITH".into(), false))
    );
}

/// People, companies and services: WORKS_FOR, RESPONSIBLE_FOR with
/// its kind ON_CALL_FOR, OWNS (person → service) and CALLS (service →
/// company).
fn people_and_services() -> Ontology {
    ontology(
        r#"
        [[entity_types]]
        name = "Person"
        description = "A person."
        [[entity_types]]
        name = "Company"
        description = "A company."
        [[entity_types]]
        name = "Service"
        description = "A running service."
        [[edge_types]]
        name = "WORKS_FOR"
        description = "Works for a company."
        source_targets = [{ source = "Person", target = "Company" }]
        [[edge_types]]
        name = "RESPONSIBLE_FOR"
        description = "Answers for a service."
        source_targets = [{ source = "Person", target = "Service" }]
        [[edge_types]]
        name = "ON_CALL_FOR"
        description = "Takes on-call shifts."
        source_targets = [{ source = "Person", target = "Service" }]
        [[edge_types]]
        name = "CALLS"
        description = "A service calls a company's API."
        source_targets = [{ source = "Service", target = "Company" }]
        [[edge_types]]
        name = "OWNS"
        description = "Owns a service."
        source_targets = [{ source = "Person", target = "Service" }]
        [edge_type_hierarchy]
        RESPONSIBLE_FOR = { ON_CALL_FOR = {} }
        "#,
    )
}

#[test]
fn a_type_that_cannot_hold_its_endpoints_yields_to_the_one_its_words_write() {
    let onto = people_and_services();
    let written = |texts: &[&str]| types_written(&onto, texts);
    let fit = |r: &str, texts: &[&str], s: &str, t: &str| {
        fitting_relation_in(&onto, r, &written(texts), s, t)
    };
    let said = [
        "Kenji Mori works for Fare Engine.",
        "I'm no longer on-call for Fare Engine",
    ];
    assert_eq!(
        written(&said),
        ["WORKS_FOR", "ON_CALL_FOR"],
        "in declared order"
    );
    assert_eq!(
        fit("WORKS_FOR", &said, "Person", "Service"),
        Some(("ON_CALL_FOR".into(), false)),
        "the episode's words name the type that fits"
    );
    assert_eq!(
        fit("WORKS_FOR", &said, "Service", "Person"),
        Some(("ON_CALL_FOR".into(), true)),
        "turned round like any fit"
    );
    assert_eq!(
        fit(
            &relation_type_of("was on call for"),
            &["was on call for"],
            "Person",
            "Service"
        ),
        Some(("ON_CALL_FOR".into(), false)),
        "a free relation that writes a declared type is that type"
    );
    assert_eq!(
        fit("RESPONSIBLE_FOR", &said, "Person", "Service"),
        Some(("RESPONSIBLE_FOR".into(), false)),
        "a type that fits is kept: the subtype walk refines it"
    );
    assert_eq!(
        fit(
            "WORKS_FOR",
            &["Kenji works for Fare Engine."],
            "Person",
            "Service"
        ),
        Some((GENERIC_RELATION.into(), false)),
        "words of a type that cannot hold the endpoints do not count"
    );
    assert_eq!(
        fit(
            "WORKS_FOR",
            &["Kenji calls Fare Engine when he is on call for it."],
            "Person",
            "Service"
        ),
        Some(("ON_CALL_FOR".into(), false)),
        "CALLS cannot hold a person and a service: one family fits"
    );
    assert_eq!(
        fit(
            "WORKS_FOR",
            &["Kenji is responsible for Fare Engine and on call for it."],
            "Person",
            "Service"
        ),
        Some(("ON_CALL_FOR".into(), false)),
        "a type and its subtype: the subtype"
    );
    assert_eq!(
        fit(
            "WORKS_FOR",
            &["Kenji owns Fare Engine and is on call for it."],
            "Person",
            "Service"
        ),
        Some((GENERIC_RELATION.into(), false)),
        "two families: neither is chosen"
    );
}

#[test]
fn a_declared_type_no_endpoint_order_or_parent_fits_is_misapplied() {
    let onto = hr();
    let misfit = |r: &str, s: &str, t: &str| {
        let (fitted, _) = fitting_relation(&onto, r, s, t).expect("a fit");
        misapplied(&onto, r, &fitted)
    };
    // "contracts for" between two companies: the free branch spelled a
    // declared type the endpoints cannot hold.
    assert!(misfit(
        &relation_type_of("contracts for"),
        "Company",
        "Company"
    ));
    // Turned round, or not a declared type: kept.
    assert!(!misfit("CONTRACTS_FOR", "Company", "Person"));
    assert!(!misfit("WORKS_WITH", "Company", "Company"));
    assert!(!misfit(GENERIC_RELATION, "Company", "Company"));
}

#[test]
fn a_property_value_is_kept_only_when_the_text_writes_it() {
    let props = [
        PropertySpec {
            name: "email".into(),
            kind: PropertyType::Text,
            description: String::new(),
            may_change: true,
            pattern: Some("^[^@ ]+@[^@ ]+$".into()),
        },
        PropertySpec {
            name: "amount".into(),
            kind: PropertyType::Float,
            description: String::new(),
            may_change: false,
            pattern: None,
        },
        PropertySpec {
            name: "signed_on".into(),
            kind: PropertyType::Date,
            description: String::new(),
            may_change: false,
            pattern: None,
        },
    ];
    let evidence =
        Evidence::of("Dana (Dana.Whitcombe@Northwind.test) signed on 1 March for USD 1,250.50.");
    let given = |pairs: &[(&str, &str)]| -> Vec<AttributeOut> {
        pairs
            .iter()
            .map(|(n, v)| AttributeOut {
                name: n.to_string(),
                value: v.to_string(),
            })
            .collect()
    };
    let (kept, notes) = typed_attributes(
        &props,
        &given(&[
            ("email", "dana.whitcombe@northwind.test"),
            ("amount", "1250.5"),
            ("signed_on", "2025-03-01"),
        ]),
        &evidence,
    );
    assert_eq!(kept.len(), 3, "{kept:?}");
    assert!(notes.is_empty(), "{notes:?}");
    let (kept, notes) = typed_attributes(
        &props,
        &given(&[("email", "dwhitcombe@example.com"), ("amount", "1250")]),
        &evidence,
    );
    assert!(kept.is_empty(), "made-up values are not stored: {kept:?}");
    assert_eq!(notes.len(), 2);
    assert!(
        notes[0].contains("`email` = `dwhitcombe@example.com` is not written"),
        "{notes:?}"
    );
    // A patterned value is copied as written, not pieced together
    // from words of the text.
    let (kept, notes) = typed_attributes(
        &props,
        &given(&[("email", "dana@whitcombe.northwind")]),
        &Evidence::of("Dana Whitcombe of Northwind (Dana.Whitcombe@Northwind.test)"),
    );
    assert!(kept.is_empty(), "{kept:?}");
    assert!(notes[0].contains("is not written"), "{notes:?}");
    // Written in the text, but not of the property's shape.
    let (kept, notes) = typed_attributes(&props, &given(&[("email", "Dana")]), &evidence);
    assert!(kept.is_empty(), "{kept:?}");
    assert!(
        notes[0].contains("does not have the property's shape"),
        "{notes:?}"
    );
    // Whole words only: a fragment of a word is not the word.
    let (kept, _) = typed_attributes(&props, &given(&[("email", "orthwind")]), &evidence);
    assert!(kept.is_empty());
}

#[test]
fn context_is_cut_around_the_name() {
    let text = format!(
        "{} Acme Corp sent PO-4471 {}",
        "a ".repeat(200),
        "b ".repeat(200)
    );
    let c = context_of(&text, "po-4471", 20);
    assert!(
        c.contains("PO-4471") && c.starts_with("… ") && c.ends_with(" …"),
        "{c}"
    );
    assert!(c.chars().count() < 80);
}

#[test]
fn fact_times_take_the_episodes_time_on_its_day_and_an_end_the_sentence_states() {
    let reference = parse_time(Some("2025-02-10T09:15:00Z"))
        .expect("time")
        .expect("some");
    let t = |s: &str| parse_time(Some(s)).expect("time");
    let at = |v| written_time(v, reference);
    let cues = crate::cues::Switches::default();
    let times = |v, i, text| fact_times(at(v), at(i), text, &cues, || None, reference);
    // A date on the episode's day is the episode's time; a written
    // time, or another day, is kept.
    assert_eq!(
        times(Some("2025-02-10"), None, "Hamid works for Tidewell"),
        (Some(reference), None)
    );
    assert_eq!(
        times(
            Some("2025-02-10T08:00:00Z"),
            None,
            "Hamid works for Tidewell"
        ),
        (t("2025-02-10T08:00:00Z"), None)
    );
    assert_eq!(
        times(Some("2025-01-06"), None, "Hamid works for Tidewell"),
        (t("2025-01-06"), None)
    );
    // An end the sentence states and the model left out.
    assert_eq!(
        times(
            Some("2025-02-10"),
            None,
            "Hamid is on contract with Tidewell until the end of March."
        ),
        (Some(reference), t("2025-03-31"))
    );
    // One the model wrote wins.
    assert_eq!(
        times(
            None,
            Some("2025-03-28"),
            "Hamid is on contract until the end of March."
        ),
        (None, t("2025-03-28"))
    );
    // An end the sentence puts on the episode's own day: its time.
    assert_eq!(
        times(None, None, "Hamid's contract with Tidewell ends tonight"),
        (None, Some(reference))
    );
    // Ended with no date: at the episode's time, and a start at that
    // very time is dropped.
    assert_eq!(
        times(Some("2025-02-10"), None, "Hamid has left Tidewell"),
        (None, Some(reference))
    );
    // The episode's end for the pair, when the fact's sentence has none.
    let today = reference.date_naive();
    assert_eq!(
        fact_times(
            at(Some("2025-02-10")),
            at(None),
            "Hamid works for Tidewell",
            &cues,
            || Some(today),
            reference
        ),
        (None, Some(reference))
    );
    assert_eq!(
        fact_times(
            at(None),
            at(Some("2025-03-28")),
            "Hamid works for Tidewell",
            &cues,
            || panic!("not read when the model gave an end"),
            reference
        ),
        (None, t("2025-03-28"))
    );
    // An end before the episode's day, found in the text, drops a start
    // the model left at the episode's time (its default), not the end;
    // a start it dated otherwise keeps its fact live.
    let friday = || today.checked_sub_days(chrono::Days::new(3));
    assert_eq!(
        fact_times(
            at(Some("2025-02-10")),
            at(None),
            "Sofia is on the rotation",
            &cues,
            friday,
            reference
        ),
        (None, t("2025-02-07"))
    );
    assert_eq!(
        fact_times(
            at(Some("2025-02-08")),
            at(None),
            "Sofia is on the rotation",
            &cues,
            friday,
            reference
        ),
        (t("2025-02-08"), None)
    );
}

#[test]
fn the_only_relation_of_two_types_is_the_broadest_type_that_fits_them() {
    let onto = ontology(
        r#"
        [[entity_types]]
        name = "Person"
        description = "A person."
        [[entity_types]]
        name = "Service"
        description = "A service."
        [[entity_types]]
        name = "Company"
        description = "A company."
        [[entity_types]]
        name = "Ticket"
        description = "A ticket."
        [[edge_types]]
        name = "RESPONSIBLE_FOR"
        description = "Answers for a service."
        source_targets = [{ source = "Person", target = "Service" }]
        [[edge_types]]
        name = "ON_CALL_FOR"
        description = "Takes on-call shifts."
        source_targets = [{ source = "Person", target = "Service" }]
        [[edge_types]]
        name = "SUPPLIED_BY"
        description = "A service uses a vendor."
        source_targets = [{ source = "Service", target = "Company" }]
        [[edge_types]]
        name = "WORKS_FOR"
        description = "Works for a company."
        source_targets = [{ source = "Person", target = "Company" }]
        [[edge_types]]
        name = "SUED"
        description = "Took a company to court."
        source_targets = [{ source = "Person", target = "Company" }]
        [[edge_types]]
        name = "CAUSED_BY"
        description = "One ticket caused another."
        source_targets = [{ source = "Ticket", target = "Ticket" }]
        [edge_type_hierarchy]
        RESPONSIBLE_FOR = { ON_CALL_FOR = {} }
        "#,
    );
    let only = |a: &str, b: &str| only_relation(&onto, a, b);
    assert_eq!(
        only("Person", "Service"),
        Some(("RESPONSIBLE_FOR".into(), false)),
        "a family: its broadest type"
    );
    assert_eq!(
        only("Company", "Service"),
        Some(("SUPPLIED_BY".into(), true))
    );
    assert_eq!(only("Person", "Company"), None, "two families");
    assert_eq!(only("Ticket", "Ticket"), None, "either way round");
    assert_eq!(only("Person", "Ticket"), None, "none fits");
}

#[test]
fn a_hand_over_of_a_relation_the_sentence_names_ends_the_givers_one() {
    let onto = people_and_services();
    let mentions = [
        mention("Tomás Ferreira", "Person"),
        mention("Sofia Brandt", "Person"),
        mention("Harbour Gateway", "Service"),
        mention("Acme Corp", "Company"),
    ];
    let episode = crate::source::Episode {
        episode_id: "chat".into(),
        source_id: None,
        group_id: "g".into(),
        document_id: None,
        source_uri: "file:///tmp/chat.jsonl#L1".into(),
        source_description: None,
        kind: crate::spec::EpisodeKind::Message,
        content: "Tomás Ferreira: On Monday 3 March I move teams. Sofia takes over my \
                  Harbour Gateway on-call shifts from that day, and my Acme Corp account."
            .into(),
        reference_time: chrono::DateTime::parse_from_rfc3339("2025-02-24T16:40:00Z")
            .expect("time")
            .to_utc(),
        reference_time_source: "field".into(),
        order: (0, 0),
    };
    let sentences = sentences_of(
        &episode.content,
        &mentions,
        &crate::cues::Switches::default(),
    );
    let spec = ExtractSpec::default();
    let ended = ended_pairs(&onto, &spec, &episode, &mentions, &sentences, &[]);
    let got: Vec<(&str, &str, &str, String)> = ended
        .iter()
        .map(|f| {
            (
                mentions[f.source].name.as_str(),
                f.relation_type(),
                mentions[f.target].name.as_str(),
                f.invalid_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![(
            "Tomás Ferreira",
            "ON_CALL_FOR",
            "Harbour Gateway",
            "2025-03-03T00:00:00+00:00".to_string()
        )],
        "the shifts the sentence names end on the day; the account is no \
         relation it names, so Tomás's work for Acme Corp does not end"
    );
    // A fact the model gave about the pair is not repeated.
    let given = FactMention {
        episode_id: "chat".into(),
        source: 0,
        target: 2,
        chain: vec!["RESPONSIBLE_FOR".into()],
        fact: "Tomás is responsible for Harbour Gateway.".into(),
        valid_at: None,
        invalid_at: None,
        mapped: false,
        written_types: Vec::new(),
        start_stated: false,
        moved: false,
    };
    let ended = ended_pairs(&onto, &spec, &episode, &mentions, &sentences, &[given]);
    assert!(ended.is_empty(), "{ended:?}");
}

#[test]
fn a_record_relates_a_field_to_what_its_object_holds_and_not_two_items_of_a_list() {
    let mentions = [
        mention("Northwind Outfitters Inc.", "Company"),
        mention("Acme Corp", "Company"),
        mention("PO-4590", "PurchaseOrder"),
        mention("PO-4614", "PurchaseOrder"),
        mention("Brightline Systems", "Company"),
        mention("Dana Whitcombe", "Person"),
    ];
    let report = r#"{"record_type": "open_po_report", "buyer": "Northwind Outfitters",
        "open_purchase_orders": [
            {"po_number": "PO-4590", "vendor": "Acme Corp", "amount": 8750.0},
            {"po_number": "PO-4614", "vendor": "Brightline Systems", "amount": 11200.0}]}"#;
    let r = RecordPlaces::new(report, &mentions, &crate::cues::Switches::default());
    assert!(r.pair_stated(1, 2), "one item of the list");
    assert!(r.pair_stated(2, 1), "either order");
    assert!(!r.pair_stated(1, 3), "two items of one list");
    assert!(!r.pair_stated(2, 3), "two items of one list");
    assert!(r.pair_stated(0, 3), "the report's own field and an item");
    assert!(r.pair_stated(0, 4), "a suffix the record leaves out");
    assert!(
        r.pair_stated(5, 1),
        "a name the record does not write passes"
    );
    // Keys count as fields; text that is not JSON is not judged.
    let keyed = r#"{"Acme Corp": {"orders": ["PO-4590", "PO-4614"]}}"#;
    let r = RecordPlaces::new(keyed, &mentions, &crate::cues::Switches::default());
    assert!(r.pair_stated(1, 3) && r.pair_stated(1, 2));
    assert!(!r.pair_stated(2, 3), "two entries of one list");
    assert!(
        RecordPlaces::new("not json", &mentions, &crate::cues::Switches::default())
            .pair_stated(1, 3)
    );
}

#[test]
fn a_record_field_named_like_an_identity_property_gives_the_named_mention_its_value() {
    let identity = |t: &str| match t {
        "Library" | "Project" => vec!["package_id".to_string()],
        "Person" => vec!["email".to_string()],
        _ => Vec::new(),
    };
    let mentions = [
        mention("quillparse", "Library"),
        mention("Priya Natarajan", "Person"),
        mention("Emberlog", "Project"),
    ];
    let feed = r#"{"registry": "crates.io", "Package_ID": "pkg:cargo/quillparse",
        "name": "quillparse", "published_by": "Priya Natarajan",
        "deps": [{"name": "Emberlog", "package_id": "pkg:cargo/emberlog"}]}"#;
    let got = stated_identities(feed, &mentions, identity);
    assert_eq!(
        got,
        [
            (0, "package_id".to_string(), json!("pkg:cargo/quillparse")),
            (2, "package_id".to_string(), json!("pkg:cargo/emberlog")),
        ],
        "each object's value goes to the mention that object names; Priya has no e-mail there"
    );
    // A value already given is kept; two mentions of one object that
    // could both hold the property leave it to neither.
    let mut given = mentions.clone();
    given[0]
        .attributes
        .insert("package_id".into(), json!("pkg:cargo/other"));
    assert_eq!(stated_identities(feed, &given, identity).len(), 1);
    let shared = r#"{"package_id": "pkg:cargo/x", "a": "quillparse", "b": "Emberlog"}"#;
    assert!(stated_identities(shared, &mentions, identity).is_empty());
    assert!(stated_identities("quillparse, pkg:cargo/quillparse", &mentions, identity).is_empty());
}

#[test]
fn a_name_is_kept_only_when_the_episode_or_its_context_writes_it() {
    let onto = ontology(
        r#"
        [[entity_types]]
        name = "Organisation"
        description = "Eine Organisation."
        [[edge_types]]
        name = "BELIEFERT"
        description = "Liefert an."
        "#,
    );
    let spec = ExtractSpec::default();
    let prompts = Prompts::new(&onto, &spec);
    let content = "Die Stadtwerke Münster-Nord liefern an ACME corp. Details: siehe Rahmenvertrag.";
    let context = ["Gestern: Brightforge   meldete sich.".to_string()];
    let shown: Vec<crate::cues::words::Written<'_>> = [content, context[0].as_str()]
        .into_iter()
        .map(crate::cues::words::Written::new)
        .collect();
    let forms: Vec<String> = [content, context[0].as_str()]
        .into_iter()
        .map(crate::text::grounding_form)
        .collect();
    let checks = super::names::NameChecks {
        spec: &spec,
        prompts: &prompts,
        content,
        shown: &shown,
        shown_forms: &forms,
        source_only: None,
    };
    let verdict =
        |name: &str| checks.not_a_name(name, &crate::text::normalize_name(name), "Organisation");
    // Case, punctuation and spacing aside, in any script, from the
    // context too.
    for name in ["Stadtwerke Münster Nord", "Acme Corp", "brightforge"] {
        assert_eq!(verdict(name), None, "{name}");
    }
    // A legal form or a word the text never writes with the name, or a
    // word cut in two, is not the text's name.
    for name in ["Brightforge GmbH", "Stadtwerke Nord", "Münst"] {
        let why = verdict(name).unwrap_or_else(|| panic!("{name} was kept"));
        assert!(
            why.contains("is not written in the episode or its context"),
            "{why}"
        );
    }
}
