//! Writing obs shards: obs/obs_NNNN.parquet with exactly one row group per tile,
//! zstd, without column statistics or page indexes (decisions.md 21).

use super::error::Result;
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

use crate::format::{self, fingerprint};
use crate::storage::Storage;

/// Size and SHA-256 of a written shard, for the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardRecord {
    pub bytes: u64,
    pub sha256: String,
}

/// Collects tiles' obs rows into shards of `tiles_per_file` row groups and puts
/// each shard (atomically) as soon as it is complete.
pub struct ShardWriter {
    schema: SchemaRef,
    tiles_per_file: u64,
    current: Option<ArrowWriter<Vec<u8>>>,
    tiles_in_current: u64,
    first_shard: usize,
    shards: Vec<ShardRecord>,
}

fn properties() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_statistics_enabled(EnabledStatistics::None)
        .set_offset_index_disabled(true)
        // A row group ends only where a tile does (flush below), never inside.
        .set_max_row_group_row_count(None)
        .build()
}

impl ShardWriter {
    /// A writer whose first shard is number `first_shard` (one part of a
    /// sharded conversion, which starts at a shard boundary).
    pub fn starting_at(schema: SchemaRef, tiles_per_file: u64, first_shard: usize) -> Self {
        ShardWriter {
            schema,
            tiles_per_file: tiles_per_file.max(1),
            current: None,
            tiles_in_current: 0,
            first_shard,
            shards: Vec::new(),
        }
    }

    /// Adds the next tile's rows as one row group.
    pub fn add_tile(&mut self, batch: &RecordBatch, storage: &dyn Storage) -> Result<()> {
        if self.current.is_none() {
            self.current = Some(ArrowWriter::try_new(Vec::new(), self.schema.clone(), Some(properties()))?);
        }
        let writer = self.current.as_mut().expect("set above");
        writer.write(batch)?;
        writer.flush()?;
        self.tiles_in_current += 1;
        if self.tiles_in_current == self.tiles_per_file {
            self.finish_shard(storage)?;
        }
        Ok(())
    }

    fn finish_shard(&mut self, storage: &dyn Storage) -> Result<()> {
        let Some(writer) = self.current.take() else { return Ok(()) };
        let bytes = writer.into_inner()?;
        let key = format::obs_shard_key(self.first_shard + self.shards.len());
        self.shards.push(ShardRecord { bytes: bytes.len() as u64, sha256: fingerprint::sha256_hex(&bytes) });
        storage.put(&key, Bytes::from(bytes))?;
        self.tiles_in_current = 0;
        Ok(())
    }

    /// Writes the last, partial shard; returns every shard's record.
    pub fn finish(mut self, storage: &dyn Storage) -> Result<Vec<ShardRecord>> {
        self.finish_shard(storage)?;
        Ok(self.shards)
    }
}
