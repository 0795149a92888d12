//! Values as the graph stores them: property values checked against their
//! declared kind, values a model wrote as text coerced to that kind, and
//! fact times normalised to UTC.

use chrono::{DateTime, NaiveDate, Utc};
use serde_json::Value;

use crate::spec::ontology::PropertyType;

/// Checks a value against a property kind and returns its stored form.
pub fn check_value(kind: PropertyType, value: &Value) -> Option<Value> {
    match kind {
        PropertyType::Text => value.as_str().map(|s| Value::String(s.to_string())),
        PropertyType::Int => value.as_i64().map(Value::from),
        PropertyType::Float => value.as_f64().map(Value::from),
        PropertyType::Bool => value.as_bool().map(Value::from),
        PropertyType::Date => {
            let s = value.as_str()?;
            let date = NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .ok()
                .or_else(|| DateTime::parse_from_rfc3339(s).ok().map(|d| d.date_naive()))?;
            Some(Value::String(date.format("%Y-%m-%d").to_string()))
        }
    }
}

/// Parses a fact time: RFC 3339 (converted to UTC), a date (midnight UTC)
/// or a year (January 1st, midnight UTC).
pub fn parse_time(text: Option<&str>) -> std::result::Result<Option<DateTime<Utc>>, String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(Some(t.with_timezone(&Utc)));
    }
    if let Ok(d) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(Some(
            d.and_hms_opt(0, 0, 0)
                .map(|t| t.and_utc())
                .unwrap_or_default(),
        ));
    }
    if text.len() == 4
        && let Ok(y) = text.parse::<i32>()
        && let Some(d) = NaiveDate::from_ymd_opt(y, 1, 1)
    {
        return Ok(Some(
            d.and_hms_opt(0, 0, 0)
                .map(|t| t.and_utc())
                .unwrap_or_default(),
        ));
    }
    Err(format!(
        "{text:?} is not a time (use RFC 3339 such as 2025-03-10T00:00:00Z, a date 2025-03-10 or a year 2025)"
    ))
}

/// Coerces a value a model wrote as text into a property's kind: numbers
/// may carry thousands separators or a currency sign, booleans may be
/// yes/no, dates may be RFC 3339 timestamps. `None` when it does not fit.
pub fn coerce_text(kind: PropertyType, text: &str) -> Option<Value> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    match kind {
        PropertyType::Text => Some(Value::String(t.to_string())),
        PropertyType::Int | PropertyType::Float => {
            let cleaned: String = t
                .chars()
                .filter(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
                .collect();
            if cleaned.is_empty() || cleaned.chars().filter(|c| *c == '.').count() > 1 {
                return None;
            }
            if kind == PropertyType::Int {
                cleaned.parse::<i64>().ok().map(Value::from)
            } else {
                cleaned
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(Value::from)
            }
        }
        PropertyType::Bool => crate::cues::booleans::yes_or_no(t).map(Value::Bool),
        PropertyType::Date => check_value(kind, &Value::String(t.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_text_is_coerced_to_the_declared_kind() {
        assert_eq!(
            coerce_text(PropertyType::Float, "USD 51,600.00"),
            Some(Value::from(51600.0))
        );
        assert_eq!(
            coerce_text(PropertyType::Int, "150"),
            Some(Value::from(150))
        );
        assert_eq!(coerce_text(PropertyType::Int, "about forty"), None);
        assert_eq!(
            coerce_text(PropertyType::Bool, "Yes"),
            Some(Value::Bool(true))
        );
        assert_eq!(
            coerce_text(PropertyType::Date, "2024-03-14T09:00:00Z"),
            Some(Value::from("2024-03-14"))
        );
        assert_eq!(coerce_text(PropertyType::Date, "March"), None);
        assert_eq!(
            coerce_text(PropertyType::Text, "  open "),
            Some(Value::from("open"))
        );
    }

    #[test]
    fn fact_times_are_normalised_to_utc() {
        let t = |s| {
            parse_time(Some(s))
                .expect("parses")
                .expect("some")
                .to_rfc3339()
        };
        assert_eq!(t("2025-03-10T09:30:00+02:00"), "2025-03-10T07:30:00+00:00");
        assert_eq!(t("2025-03-10"), "2025-03-10T00:00:00+00:00");
        assert_eq!(t("2025"), "2025-01-01T00:00:00+00:00");
        assert_eq!(parse_time(Some("  ")), Ok(None));
        assert!(parse_time(Some("last week")).is_err());
    }
}
