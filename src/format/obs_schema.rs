//! obs/schema.json (format.md, "Obs"; decisions.md 15-16): the kinds, Arrow types
//! and vocabularies of the obs columns.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const SCHEMA_FORMAT: &str = "deltacells-obs";
pub const SCHEMA_VERSION: u64 = 1;

/// How a column is stored (format.md, "Obs", the kind table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObsKind {
    Category,
    Numeric,
    Bool,
    String,
}

impl ObsKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObsKind::Category => "category",
            ObsKind::Numeric => "numeric",
            ObsKind::Bool => "bool",
            ObsKind::String => "string",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObsColumn {
    pub name: String,
    pub kind: ObsKind,
    pub arrow_type: String,
    pub categories: Option<Vec<Value>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObsSchema {
    pub format: String,
    pub version: u64,
    pub columns: Vec<ObsColumn>,
}

/// Arrow type names of decisions.md 15 that each kind may use.
fn allowed_types(kind: ObsKind) -> &'static [&'static str] {
    match kind {
        // decisions.md 16: any signed integer type that holds the codes
        ObsKind::Category => &["int8", "int16", "int32", "int64"],
        ObsKind::Numeric => {
            &["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float", "double"]
        }
        ObsKind::Bool => &["bool"],
        ObsKind::String => &["string"],
    }
}

/// Why schema.json is not a schema: not JSON of its form, or a rule broken.
#[derive(Debug, thiserror::Error)]
pub enum ObsSchemaError {
    #[error("not a valid schema")]
    Json(#[source] serde_json::Error),
    #[error("{0}")]
    Rule(String),
}

impl ObsSchema {
    /// Parses and checks schema.json: format and version, kinds, Arrow types
    /// allowed for each kind, categories present exactly for category columns,
    /// unique names.
    pub fn parse(bytes: &[u8]) -> Result<ObsSchema, ObsSchemaError> {
        let rule = ObsSchemaError::Rule;
        let schema: ObsSchema = serde_json::from_slice(bytes).map_err(ObsSchemaError::Json)?;
        if schema.format != SCHEMA_FORMAT {
            return Err(rule(format!("format is {:?}, expected {SCHEMA_FORMAT:?}", schema.format)));
        }
        if schema.version != SCHEMA_VERSION {
            return Err(rule(format!("version is {}, expected {SCHEMA_VERSION}", schema.version)));
        }
        let mut names = std::collections::HashSet::new();
        for c in &schema.columns {
            if !names.insert(c.name.as_str()) {
                return Err(rule(format!("column {:?} appears twice", c.name)));
            }
            if !allowed_types(c.kind).contains(&c.arrow_type.as_str()) {
                return Err(rule(format!(
                    "column {:?}: arrow_type {:?} is not allowed for kind {}",
                    c.name,
                    c.arrow_type,
                    c.kind.as_str()
                )));
            }
            match (c.kind, &c.categories) {
                (ObsKind::Category, None) => {
                    return Err(rule(format!("column {:?}: a category column needs categories", c.name)))
                }
                (ObsKind::Category, Some(cats)) => {
                    let max = match c.arrow_type.as_str() {
                        "int8" => i8::MAX as usize,
                        "int16" => i16::MAX as usize,
                        "int32" => i32::MAX as usize,
                        _ => usize::MAX,
                    };
                    if cats.len() > max + 1 {
                        return Err(rule(format!(
                            "column {:?}: {} categories do not fit codes of {}",
                            c.name,
                            cats.len(),
                            c.arrow_type
                        )));
                    }
                }
                (_, Some(_)) => {
                    return Err(rule(format!(
                        "column {:?}: categories must be null for kind {}",
                        c.name,
                        c.kind.as_str()
                    )))
                }
                (_, None) => {}
            }
        }
        Ok(schema)
    }

    pub fn column(&self, name: &str) -> Option<&ObsColumn> {
        self.columns.iter().find(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let ok = br#"{"format": "deltacells-obs", "version": 1, "columns": [
            {"name": "obs_names", "kind": "string", "arrow_type": "string", "categories": null},
            {"name": "t", "kind": "category", "arrow_type": "int8", "categories": ["a", "b"]},
            {"name": "x", "kind": "numeric", "arrow_type": "float", "categories": null}]}"#;
        let s = ObsSchema::parse(ok).unwrap();
        assert_eq!(s.columns.len(), 3);
        assert_eq!(s.column("t").unwrap().kind, ObsKind::Category);
        let bad = |from: &str, to: &str| ObsSchema::parse(String::from_utf8_lossy(ok).replace(from, to).as_bytes());
        assert!(bad("\"version\": 1", "\"version\": 2").is_err());
        assert!(bad("\"float\"", "\"timestamp\"").is_err());
        assert!(bad("[\"a\", \"b\"]", "null").is_err());
        assert!(bad("\"kind\": \"numeric\"", "\"kind\": \"date\"").is_err());
        assert!(bad("\"name\": \"x\"", "\"name\": \"t\"").is_err());
    }
}
