//! A collection written down: the JSON file `Collection::save` writes and
//! `open_collection` reads back (its datasets with their manifests'
//! digests, its genes and weights), parsed and checked here.

use std::collections::HashMap;
use std::path::Path;

use super::{Collection, CollectionError, GeneChoice};
use crate::storage::StoreOptions;

/// The collection file's version this build writes and reads.
pub const COLLECTION_FILE_VERSION: u64 = 1;

/// Why a text is not a collection file, or its weights not the collection's.
#[derive(Debug, thiserror::Error)]
pub enum CollectionFileError {
    /// Not JSON: the parser's error, kept as it is, reads inside the
    /// parentheses (where no `source()` prints), so it is no source.
    #[error("not a collection file (not JSON: {0})")]
    NotJson(serde_json::Error),
    /// JSON that breaks a rule of the file (the message says which).
    #[error("{0}")]
    Rule(String),
    /// A weight given for a name that is no dataset of the collection.
    #[error("weights: {name:?} is not a dataset of the collection")]
    UnknownWeight { name: String },
}

impl From<String> for CollectionFileError {
    fn from(message: String) -> Self {
        CollectionFileError::Rule(message)
    }
}

impl From<&str> for CollectionFileError {
    fn from(message: &str) -> Self {
        CollectionFileError::Rule(message.to_string())
    }
}

/// A collection written down: a small JSON file that `open_collection`
/// reads back (roots relative to the file's folder are resolved from it).
#[derive(Clone, Debug, PartialEq)]
pub struct CollectionFile {
    /// (name, root, SHA-256 of its manifest.json when recorded).
    pub datasets: Vec<(String, String, Option<String>)>,
    pub genes: GeneChoice,
    pub gene_column: Option<String>,
    /// Weights by dataset name, when the collection has them.
    pub weights: Option<Vec<(String, f64)>>,
}

impl CollectionFile {
    /// The file's JSON text.
    pub fn to_json(&self) -> String {
        let datasets: Vec<serde_json::Value> = self
            .datasets
            .iter()
            .map(|(name, root, digest)| serde_json::json!({"name": name, "root": root, "manifest_sha256": digest}))
            .collect();
        let weights = self.weights.as_ref().map(|w| {
            w.iter()
                .map(|(n, v)| (n.clone(), serde_json::json!(v)))
                .collect::<serde_json::Map<String, serde_json::Value>>()
        });
        let value = serde_json::json!({
            "deltacells_collection": COLLECTION_FILE_VERSION,
            "datasets": datasets,
            "genes": self.genes.to_json(),
            "gene_column": self.gene_column,
            "weights": weights,
        });
        serde_json::to_string_pretty(&value).unwrap_or_default() + "\n"
    }

    /// Reads the collection file at `path` (a local file): its roots as
    /// written, and resolved against the file's folder when relative.
    pub fn read(path: &Path) -> Result<CollectionFile, CollectionError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| CollectionError::Read { path: path.display().to_string(), source })?;
        let mut file = CollectionFile::parse(&text)
            .map_err(|source| CollectionError::File { path: path.display().to_string(), source })?;
        let base = path.parent().unwrap_or(Path::new(""));
        for (_, root, _) in &mut file.datasets {
            if !root.contains("://") && Path::new(root.as_str()).is_relative() {
                *root = base.join(root.as_str()).display().to_string();
            }
        }
        Ok(file)
    }

    /// The file's JSON text, checked.
    pub fn parse(text: &str) -> Result<CollectionFile, CollectionFileError> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(CollectionFileError::NotJson)?;
        let version = value.get("deltacells_collection").and_then(serde_json::Value::as_u64);
        match version {
            None => return Err("not a collection file (no \"deltacells_collection\" version)".into()),
            Some(v) if v != COLLECTION_FILE_VERSION => {
                return Err(format!(
                    "collection file version {v}; this deltacells reads version {COLLECTION_FILE_VERSION}"
                )
                .into())
            }
            Some(_) => {}
        }
        let items = value.get("datasets").and_then(serde_json::Value::as_array).ok_or("\"datasets\" is not a list")?;
        let mut datasets = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let text = |key: &str| item.get(key).and_then(serde_json::Value::as_str).map(str::to_string);
            let root = text("root").ok_or_else(|| format!("datasets[{i}] has no \"root\""))?;
            let name = text("name").unwrap_or_else(|| root.clone());
            datasets.push((name, root, text("manifest_sha256")));
        }
        let genes = match value.get("genes") {
            None | Some(serde_json::Value::Null) => GeneChoice::Union,
            Some(g) => GeneChoice::from_json(g)?,
        };
        let gene_column = value.get("gene_column").and_then(serde_json::Value::as_str).map(str::to_string);
        let weights = match value.get("weights") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Object(map)) => Some(
                map.iter()
                    .map(|(k, v)| {
                        v.as_f64().map(|w| (k.clone(), w)).ok_or_else(|| format!("weights[{k:?}] is not a number"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(_) => return Err("\"weights\" is not a mapping of dataset names to numbers".into()),
        };
        Ok(CollectionFile { datasets, genes, gene_column, weights })
    }

    /// Opens the collection the file describes, refusing (by name) a dataset
    /// whose manifest is not the one recorded.
    pub fn open(&self, store: &StoreOptions) -> Result<Collection, CollectionError> {
        self.open_in(store, None)
    }

    /// [`CollectionFile::open`], its datasets remembering their checked
    /// tiles in `cache_dir` (see [`Collection::open_in`]).
    pub fn open_in(
        &self,
        store: &StoreOptions,
        cache_dir: Option<std::path::PathBuf>,
    ) -> Result<Collection, CollectionError> {
        let pairs: Vec<(String, String)> = self.datasets.iter().map(|(n, r, _)| (n.clone(), r.clone())).collect();
        let collection = Collection::open_in(&pairs, &self.genes, self.gene_column.as_deref(), store, cache_dir)?;
        for ((name, root, recorded), member) in self.datasets.iter().zip(collection.members()) {
            if let Some(was) = recorded {
                if *was != member.manifest_sha256 {
                    return Err(CollectionError::Changed {
                        name: name.clone(),
                        root: root.clone(),
                        was: was.clone(),
                        now: member.manifest_sha256.clone(),
                    });
                }
            }
        }
        Ok(collection)
    }

    /// Weights in the collection's dataset order (0 for a dataset the file
    /// gives none), refusing a name that is no dataset of it.
    pub fn weights_in_order(&self) -> Result<Option<Vec<f64>>, CollectionFileError> {
        let Some(weights) = &self.weights else { return Ok(None) };
        let index: HashMap<&str, usize> =
            self.datasets.iter().enumerate().map(|(i, (n, _, _))| (n.as_str(), i)).collect();
        let mut out = vec![0.0; self.datasets.len()];
        for (name, w) in weights {
            let i =
                index.get(name.as_str()).ok_or_else(|| CollectionFileError::UnknownWeight { name: name.clone() })?;
            out[*i] = *w;
        }
        Ok(Some(out))
    }
}
