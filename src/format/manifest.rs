//! manifest.json: parsing, the structural rules of decisions.md 8 and the count
//! consistency rules of decisions.md 9.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub const FORMAT_NAME: &str = "deltacells-dataset";
pub const FORMAT_VERSION: u64 = 2;

/// The dataset manifest (format.md, "manifest.json").
///
/// Field order here is the order in which the writer emits keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u64,
    pub n_cells: u64,
    pub n_genes: u64,
    pub tile_size: u64,
    pub tile_cells: Vec<u64>,
    pub tile_nnz: Vec<u64>,
    pub tile_bytes: Vec<u64>,
    pub n_chunks: u64,
    pub zstd_level: i64,
    pub has_gene_order: bool,
    pub has_var_names: bool,
    pub has_var_table: bool,
    pub has_obs: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub obs_tiles_per_file: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub obs_shard_bytes: Option<Vec<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub obs_shard_sha256: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub obs_fingerprint: Option<String>,
    pub metadata: Map<String, Value>,
}

/// Why a manifest was rejected; [`ManifestError::rule`] names the rule.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ManifestError {
    #[error("not valid JSON: {0}")]
    Json(String),
    #[error("format is {0}, expected \"deltacells-dataset\"")]
    Format(String),
    #[error("version is {0}, expected 2")]
    Version(String),
    #[error("{0}")]
    Field(String),
    #[error("{0}")]
    Counts(String),
    #[error("{0}")]
    Obs(String),
}

impl ManifestError {
    pub fn rule(&self) -> &'static str {
        match self {
            ManifestError::Json(_) => "manifest-json",
            ManifestError::Format(_) => "manifest-format",
            ManifestError::Version(_) => "manifest-version",
            ManifestError::Field(_) => "manifest-fields",
            ManifestError::Counts(_) => "manifest-counts",
            ManifestError::Obs(_) => "manifest-obs",
        }
    }
}

/// The obs part of a manifest, present exactly when has_obs is true.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObsManifest<'a> {
    pub tiles_per_file: u64,
    pub shard_bytes: &'a [u64],
    pub shard_sha256: &'a [String],
    pub fingerprint: &'a str,
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Manifest {
    /// Parses manifest.json: the format name and version first (so that a newer
    /// manifest says so rather than failing on a field), then every required key
    /// with its JSON type (decisions.md 8). Counts are checked by [`Manifest::check`].
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| ManifestError::Json(e.to_string()))?;
        let object = value.as_object().ok_or_else(|| ManifestError::Json("not a JSON object".into()))?;
        match object.get("format") {
            Some(Value::String(s)) if s == FORMAT_NAME => {}
            other => return Err(ManifestError::Format(other.map_or("missing".into(), Value::to_string))),
        }
        match object.get("version") {
            Some(v) if v.as_u64() == Some(FORMAT_VERSION) => {}
            other => return Err(ManifestError::Version(other.map_or("missing".into(), Value::to_string))),
        }
        let manifest: Manifest = serde_json::from_value(value).map_err(|e| ManifestError::Field(e.to_string()))?;
        if manifest.has_obs {
            for (key, present) in [
                ("obs_tiles_per_file", manifest.obs_tiles_per_file.is_some()),
                ("obs_shard_bytes", manifest.obs_shard_bytes.is_some()),
                ("obs_shard_sha256", manifest.obs_shard_sha256.is_some()),
                ("obs_fingerprint", manifest.obs_fingerprint.is_some()),
            ] {
                if !present {
                    return Err(ManifestError::Field(format!("has_obs is true but {key} is missing")));
                }
            }
        }
        Ok(manifest)
    }

    /// Parses and checks: what a reader needs before it trusts any count.
    pub fn parse_checked(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let manifest = Manifest::parse(bytes)?;
        match manifest.check().into_iter().next() {
            Some(err) => Err(err),
            None => Ok(manifest),
        }
    }

    pub fn n_tiles(&self) -> usize {
        self.tile_cells.len()
    }

    /// The obs fields, when has_obs is true (their presence is checked by `parse`).
    pub fn obs(&self) -> Option<ObsManifest<'_>> {
        if !self.has_obs {
            return None;
        }
        Some(ObsManifest {
            tiles_per_file: self.obs_tiles_per_file?,
            shard_bytes: self.obs_shard_bytes.as_deref()?,
            shard_sha256: self.obs_shard_sha256.as_deref()?,
            fingerprint: self.obs_fingerprint.as_deref()?,
        })
    }

    /// Every inconsistency of decisions.md 9 that the manifest shows on its own.
    pub fn check(&self) -> Vec<ManifestError> {
        let mut errors = Vec::new();
        let mut counts = |msg: String| errors.push(ManifestError::Counts(msg));
        if self.tile_size == 0 {
            counts("tile_size is 0".into());
        }
        if self.n_genes > super::MAX_GENES || (self.n_genes == 0 && self.n_cells > 0) {
            counts(format!("n_genes {} outside 1..2^31", self.n_genes));
        }
        let n_tiles = if self.tile_size == 0 { 0 } else { self.n_cells.div_ceil(self.tile_size) };
        for (key, len) in [
            ("tile_cells", self.tile_cells.len()),
            ("tile_nnz", self.tile_nnz.len()),
            ("tile_bytes", self.tile_bytes.len()),
        ] {
            if len as u64 != n_tiles {
                counts(format!(
                    "{key} has {len} entries, but {} cells in tiles of {} need {n_tiles}",
                    self.n_cells, self.tile_size
                ));
            }
        }
        let sum = self.tile_cells.iter().fold(0u64, |a, &b| a.saturating_add(b));
        if sum != self.n_cells {
            counts(format!("tile_cells sum to {sum}, but n_cells is {}", self.n_cells));
        }
        let last = self.tile_cells.len().saturating_sub(1);
        for (i, &cells) in self.tile_cells.iter().enumerate() {
            if i < last && cells != self.tile_size {
                counts(format!(
                    "tile {i} has {cells} cells; every tile but the last must have tile_size {}",
                    self.tile_size
                ));
            }
            if i == last && (cells == 0 || cells > self.tile_size) {
                counts(format!("last tile {i} has {cells} cells, outside 1..{}", self.tile_size));
            }
        }
        for (i, (&cells, &nnz)) in self.tile_cells.iter().zip(&self.tile_nnz).enumerate() {
            if u128::from(nnz) > u128::from(cells) * u128::from(self.n_genes) {
                counts(format!("tile {i}: tile_nnz {nnz} exceeds {cells} cells x {} genes", self.n_genes));
            }
        }
        if let Some(obs) = self.obs() {
            let mut obs_err = |msg: String| errors.push(ManifestError::Obs(msg));
            if obs.tiles_per_file == 0 {
                obs_err("obs_tiles_per_file is 0".into());
            } else {
                let n_shards = (self.tile_cells.len() as u64).div_ceil(obs.tiles_per_file);
                for (key, len) in
                    [("obs_shard_bytes", obs.shard_bytes.len()), ("obs_shard_sha256", obs.shard_sha256.len())]
                {
                    if len as u64 != n_shards {
                        obs_err(format!(
                            "{key} has {len} entries, but {} tiles in shards of {} need {n_shards}",
                            self.tile_cells.len(),
                            obs.tiles_per_file
                        ));
                    }
                }
            }
            if let Some((i, s)) = obs.shard_sha256.iter().enumerate().find(|(_, s)| !is_lower_hex(s, 64)) {
                obs_err(format!("obs_shard_sha256[{i}] {s:?} is not 64 lowercase hex digits"));
            }
            if !is_lower_hex(obs.fingerprint, 24) {
                obs_err(format!("obs_fingerprint {:?} is not 24 lowercase hex digits", obs.fingerprint));
            }
        }
        errors
    }

    /// The manifest as the writer emits it: pretty JSON with a final newline.
    ///
    /// # Panics
    ///
    /// Never: a manifest holds numbers, strings and JSON values, which always
    /// serialize.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a manifest always serializes");
        text.push('\n');
        text
    }
}

/// The metadata key under which the writers that change a finished dataset
/// (append, a sharded append's finalize, compact) list the SHA-256 of each
/// manifest the new version descends from, the latest last: a reader of an
/// older version tells a later version of its dataset from another dataset
/// made with the same inputs and options.
pub const LINEAGE_KEY: &str = "lineage";

/// The most versions a lineage lists: a reader more changes behind than
/// this takes the dataset as replaced.
pub const LINEAGE_KEPT: usize = 64;

/// Adds `base_sha256` (the manifest a writer started from) to the lineage in
/// `metadata`, the oldest entries dropped beyond [`LINEAGE_KEPT`].
pub fn extend_lineage(metadata: &mut Map<String, Value>, base_sha256: &str) {
    let mut list: Vec<Value> = match metadata.get(LINEAGE_KEY) {
        Some(Value::Array(list)) => list.clone(),
        _ => Vec::new(),
    };
    list.push(Value::String(base_sha256.to_string()));
    let extra = list.len().saturating_sub(LINEAGE_KEPT);
    list.drain(..extra);
    metadata.insert(LINEAGE_KEY.into(), Value::Array(list));
}

/// The lineage `metadata` lists, or None when it has none (a dataset no
/// writer changed, or one an older writer did).
pub fn lineage(metadata: &Map<String, Value>) -> Option<Vec<&str>> {
    match metadata.get(LINEAGE_KEY)? {
        Value::Array(list) => Some(list.iter().filter_map(Value::as_str).collect()),
        _ => Some(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Value {
        serde_json::json!({
            "format": "deltacells-dataset", "version": 2, "n_cells": 10, "n_genes": 50, "tile_size": 4,
            "tile_cells": [4, 4, 2], "tile_nnz": [15, 50, 17], "tile_bytes": [657, 706, 377],
            "n_chunks": 8, "zstd_level": 19, "has_gene_order": false, "has_var_names": false,
            "has_var_table": false, "has_obs": false, "metadata": {"generator": "x"}, "extra": [1]
        })
    }

    fn parse(v: &Value) -> Result<Manifest, ManifestError> {
        Manifest::parse_checked(v.to_string().as_bytes())
    }

    #[test]
    fn accepts_a_valid_manifest_with_extra_keys() {
        let m = parse(&tiny()).unwrap();
        assert_eq!(m.n_tiles(), 3);
        assert!(m.obs().is_none());
        let again = Manifest::parse_checked(m.to_json().as_bytes()).unwrap();
        assert_eq!(again, m);
    }

    #[test]
    fn rejects_by_rule() {
        let rule = |f: &dyn Fn(&mut Value)| {
            let mut v = tiny();
            f(&mut v);
            parse(&v).unwrap_err().rule()
        };
        assert_eq!(rule(&|v| v["version"] = 3.into()), "manifest-version");
        assert_eq!(rule(&|v| v["version"] = "2".into()), "manifest-version");
        assert_eq!(rule(&|v| v["format"] = "x".into()), "manifest-format");
        assert_eq!(rule(&|v| v["has_obs"] = 0.into()), "manifest-fields");
        assert_eq!(rule(&|v| v["n_cells"] = 10.0.into()), "manifest-fields");
        assert_eq!(rule(&|v| v["n_cells"] = (-1).into()), "manifest-fields");
        assert_eq!(rule(&|v| drop(v.as_object_mut().unwrap().remove("zstd_level"))), "manifest-fields");
        assert_eq!(rule(&|v| drop(v.as_object_mut().unwrap().remove("metadata"))), "manifest-fields");
        assert_eq!(rule(&|v| v["metadata"] = Value::Null), "manifest-fields");
        assert_eq!(rule(&|v| v["n_cells"] = 11.into()), "manifest-counts");
        assert_eq!(rule(&|v| v["tile_cells"] = serde_json::json!([4, 3, 3])), "manifest-counts");
        assert_eq!(rule(&|v| v["tile_nnz"] = serde_json::json!([15, 50])), "manifest-counts");
        assert_eq!(rule(&|v| v["tile_nnz"] = serde_json::json!([15, 201, 17])), "manifest-counts");
        assert_eq!(rule(&|v| v["has_obs"] = true.into()), "manifest-fields");
        assert!(matches!(Manifest::parse(b"{"), Err(ManifestError::Json(_))));
        assert!(matches!(Manifest::parse(b"[]"), Err(ManifestError::Json(_))));
    }

    #[test]
    fn obs_fields_are_checked() {
        let mut v = tiny();
        v["has_obs"] = true.into();
        v["obs_tiles_per_file"] = 2.into();
        v["obs_shard_bytes"] = serde_json::json!([10, 20]);
        v["obs_shard_sha256"] = serde_json::json!(["a".repeat(64), "b".repeat(64)]);
        v["obs_fingerprint"] = "0123456789abcdef01234567".into();
        assert!(parse(&v).unwrap().obs().is_some());
        v["obs_shard_bytes"] = serde_json::json!([10]);
        assert_eq!(parse(&v).unwrap_err().rule(), "manifest-obs");
        v["obs_shard_bytes"] = serde_json::json!([10, 20]);
        v["obs_fingerprint"] = "0123456789ABCDEF01234567".into();
        assert_eq!(parse(&v).unwrap_err().rule(), "manifest-obs");
    }

    #[test]
    fn empty_dataset_has_no_tiles() {
        let mut v = tiny();
        v["n_cells"] = 0.into();
        for k in ["tile_cells", "tile_nnz", "tile_bytes"] {
            v[k] = serde_json::json!([]);
        }
        assert_eq!(parse(&v).unwrap().n_tiles(), 0);
    }
}
