//! Writing obs shards: obs/obs_NNNN.parquet with exactly one row group per tile,
//! zstd, without column statistics or page indexes (decisions.md 21).
//!
//! A shard is written as its tiles come, to a temporary file the storage
//! gives (beside the shard, for a local folder), hashed as it is written, and
//! put when complete: a shard of a thousand tiles of 10,000 cells is tens of
//! megabytes of Parquet that a conversion need not hold in memory.
//!
//! Each tile's rows are encoded by the Arrow writer's column encoders into a
//! row group of their own (what `ArrowWriter` writes, byte for byte), or, for
//! the tiles an append keeps of the shard it rewrites, copied from the stored
//! shard as they are encoded when their columns are unchanged.

use super::base::StoredObsRows;
use super::error::{ConvertError, Result};
use super::obs_merge::ObsPlan;
use std::io::{BufWriter, Write};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use parquet::arrow::arrow_writer::{compute_leaves, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use sha2::{Digest, Sha256};

use crate::format;
use crate::storage::{Spool, Storage};

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
    current: Option<OpenShard>,
    tiles_in_current: u64,
    first_shard: usize,
    shards: Vec<ShardRecord>,
}

/// The shard being written: the Parquet file (with the Arrow schema in its
/// footer, as an `ArrowWriter` writes it) and the encoders of its columns.
struct OpenShard {
    file: SerializedFileWriter<Hashed>,
    columns: ArrowRowGroupWriterFactory,
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

    /// The shard being written, started when there is none.
    fn open(&mut self, storage: &dyn Storage) -> Result<&mut OpenShard> {
        if self.current.is_none() {
            let spool = storage.spool(&self.next_key())?;
            let out = Hashed { out: BufWriter::with_capacity(1 << 20, spool), hash: Sha256::new(), bytes: 0 };
            let (file, columns) =
                ArrowWriter::try_new(out, self.schema.clone(), Some(properties()))?.into_serialized_writer()?;
            self.current = Some(OpenShard { file, columns });
        }
        Ok(self.current.as_mut().expect("set above"))
    }

    /// Adds the next tile's rows as one row group.
    pub fn add_tile(&mut self, batch: &RecordBatch, storage: &dyn Storage) -> Result<()> {
        let schema = self.schema.clone();
        let shard = self.open(storage)?;
        // (what ArrowWriter's write and flush do, a row group at a time)
        let mut encoders = shard.columns.create_column_writers(shard.file.flushed_row_groups().len())?.into_iter();
        let mut used = Vec::new();
        for (field, column) in schema.fields().iter().zip(batch.columns()) {
            for leaf in compute_leaves(field, column)? {
                let mut encoder = encoders.next().ok_or_else(|| {
                    ConvertError::Stopped(format!("obs column {:?}: more leaves than the schema's", field.name()))
                })?;
                encoder.write(&leaf)?;
                used.push(encoder);
            }
        }
        let mut group = shard.file.next_row_group()?;
        for encoder in used {
            encoder.close()?.append_to_row_group(&mut group)?;
        }
        group.close()?;
        self.tile_added(storage)
    }

    /// Adds tile `i` of a stored shard, `kept`, as the next row group: its
    /// encoded bytes copied as they are when its columns are those of `plan`
    /// (an append to a dataset whose last shard is not full rewrites that
    /// shard; copying its tiles instead of decoding and encoding them again
    /// keeps an append's time from growing with the shard), else its rows
    /// restated into `plan`'s schema. Returns the tile's rows.
    pub fn add_kept(&mut self, kept: &StoredObsRows, i: usize, plan: &ObsPlan, storage: &dyn Storage) -> Result<u64> {
        let Some((bytes, group)) = kept.encoded(i).filter(|_| kept.unchanged_in(plan)) else {
            let batch = kept.restated(i, plan)?;
            self.add_tile(&batch, storage)?;
            return Ok(batch.num_rows() as u64);
        };
        let rows = group.num_rows().max(0) as u64;
        let mut out = self.open(storage)?.file.next_row_group()?;
        for column in group.columns() {
            let close = ColumnCloseResult {
                bytes_written: column.compressed_size().max(0) as u64,
                rows_written: rows,
                metadata: column.clone(),
                bloom_filter: None,
                column_index: None,
                offset_index: None,
            };
            out.append_column(bytes, close)
                .map_err(|e| ConvertError::invalid(kept.location(), format!("row group {i}: {e}")))?;
        }
        out.close()?;
        self.tile_added(storage)?;
        Ok(rows)
    }

    /// Counts the tile just added, and puts the shard when it is full.
    fn tile_added(&mut self, storage: &dyn Storage) -> Result<()> {
        self.tiles_in_current += 1;
        if self.tiles_in_current == self.tiles_per_file {
            self.finish_shard(storage)?;
        }
        Ok(())
    }

    fn next_key(&self) -> String {
        format::obs_shard_key(self.first_shard + self.shards.len())
    }

    fn finish_shard(&mut self, storage: &dyn Storage) -> Result<()> {
        let Some(OpenShard { file, .. }) = self.current.take() else { return Ok(()) };
        let Hashed { out, hash, bytes } = file.into_inner()?;
        let key = self.next_key();
        let spool = out.into_inner().map_err(|e| crate::storage::StorageError::Io {
            location: storage.location(&key),
            source: e.into_error(),
        })?;
        storage.put_spooled(&key, spool)?;
        self.shards.push(ShardRecord { bytes, sha256: hex::encode(hash.finalize()) });
        self.tiles_in_current = 0;
        Ok(())
    }

    /// Writes the last, partial shard; returns every shard's record.
    pub fn finish(mut self, storage: &dyn Storage) -> Result<Vec<ShardRecord>> {
        self.finish_shard(storage)?;
        Ok(self.shards)
    }
}

/// A shard's file as it is written, with its SHA-256 and length so far.
struct Hashed {
    out: BufWriter<Spool>,
    hash: Sha256,
    bytes: u64,
}

impl Write for Hashed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(buf.get(..n).unwrap_or(buf));
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
