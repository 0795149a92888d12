//! What a model writes about a person in place of, or after, the name:
//! a job title ("Customer Success Manager"), an affiliation ("Oskar from
//! Pellucid").

/// The last words of job titles: "Customer Success Manager", "Enterprise
/// Sales Lead", "Chief Revenue Officer".
const TITLE_HEADS: [&str; 16] = [
    "manager",
    "lead",
    "director",
    "officer",
    "engineer",
    "analyst",
    "specialist",
    "coordinator",
    "administrator",
    "consultant",
    "representative",
    "executive",
    "counsel",
    "controller",
    "president",
    "architect",
];

/// Whether `name` is a job title: two or more capitalised words (or a
/// title with "of"/"and"/"for" inside) that end in a title's last word
/// ([`TITLE_HEADS`]), with no digit, bracket or comma. Asked only of names
/// offered as people: a person's name does not end in "Manager", a
/// product's may ("Secrets Manager"), so the caller checks the type.
pub fn job_title(name: &str) -> bool {
    let words: Vec<&str> = name.split_whitespace().collect();
    if words.len() < 2 || name.contains(|c: char| c.is_ascii_digit() || "(),<>@".contains(c)) {
        return false;
    }
    let last = words[words.len() - 1].to_lowercase();
    TITLE_HEADS.contains(&last.as_str())
        && words
            .iter()
            .all(|w| w.starts_with(char::is_uppercase) || matches!(*w, "of" | "and" | "for" | "&"))
}

/// A name without the affiliation a writer put after it: "Oskar from
/// Pellucid" is Oskar, who is with Pellucid. Only capitalised words on both
/// sides of a lower-case "from" make one, so "Sales from Q3" or "data from
/// the ledger" stay whole (the other checks judge them); a title built
/// this way ("Letters From Home") writes "From" capitalised and is kept.
pub fn without_affiliation(name: &str) -> &str {
    let trimmed = name.trim();
    let Some((person, affiliation)) = trimmed.split_once(" from ") else {
        return trimmed;
    };
    let capitalised = |part: &str| {
        let mut words = part.split_whitespace().peekable();
        words.peek().is_some() && words.all(|w| w.starts_with(char::is_uppercase))
    };
    if capitalised(person) && capitalised(affiliation) {
        person.trim()
    } else {
        trimmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_title_without_a_name_is_a_job_title() {
        for title in [
            "Customer Success Manager",
            "Enterprise Sales Lead",
            "Chief Revenue Officer",
            "VP of Engineering and Operations Director",
            "Site Reliability Engineer",
        ] {
            assert!(job_title(title), "{title}");
        }
        for name in [
            "Priya Raman",
            "Manager",
            "Priya Raman, Procurement Manager",
            "Dana Whitcombe (Sales Lead)",
            "Lead",
            "the procurement manager",
            "Grace Adeyemi",
        ] {
            assert!(!job_title(name), "{name}");
        }
    }

    #[test]
    fn an_affiliation_written_after_a_name_is_not_part_of_it() {
        assert_eq!(without_affiliation("Oskar from Pellucid"), "Oskar");
        assert_eq!(
            without_affiliation("Priya Raman from Acme Corp"),
            "Priya Raman"
        );
        for name in [
            "Letters From Home",
            "Sales from Q3 2025",
            "Oskar from the vendor",
            "Oskar",
        ] {
            assert_eq!(without_affiliation(name), name, "{name}");
        }
    }
}
