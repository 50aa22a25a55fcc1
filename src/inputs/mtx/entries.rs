//! The entries of a Matrix Market matrix: its header, and its entries parsed
//! once into a temporary file sorted by cell, in runs sorted in memory and
//! merged, so that memory stays bounded whatever the file's size.

use std::io::{BufRead, Write};
use std::ops::Range;

use super::place::{read_line, LineError, LineProblem};

/// Entries sorted in memory at once before they are written to the
/// temporary file: 16 bytes each, so 64 MiB.
pub const RUN_ENTRIES: usize = 4 << 20;

/// The bytes of an entry in the temporary file: cell and gene as u32, value
/// as f64, little-endian.
pub(super) const ENTRY_BYTES: usize = 16;

/// The matrix's first lines.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Header {
    pub(super) rows: u64,
    pub(super) cols: u64,
    pub(super) entries: u64,
    /// The line of the first entry (1-based).
    pub(super) first_line: u64,
}

/// Whether the matrix is stored genes x cells.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Orientation {
    GenesByCells,
    CellsByGenes,
}

/// Reads the banner and the sizes line.
pub(super) fn read_header(stream: &mut dyn BufRead) -> Result<Header, LineError> {
    let mut line = Vec::new();
    let mut n = 0u64;
    let mut next = |line: &mut Vec<u8>| -> Result<bool, LineError> {
        n += 1;
        let read = read_line(stream, line).map_err(|m| (n, m))?;
        Ok(read > 0)
    };
    if !next(&mut line)? {
        return Err((1, "is empty".into()));
    }
    let banner = String::from_utf8_lossy(&line).to_lowercase();
    let words: Vec<&str> = banner.split_whitespace().collect();
    if words.first() != Some(&"%%matrixmarket") {
        return Err((1, "does not start with %%MatrixMarket: not a Matrix Market file".into()));
    }
    match words.get(1..5) {
        Some(["matrix", "coordinate", "integer" | "real", "general"]) => {}
        Some(["matrix", "array", ..]) => {
            return Err((1, "unsupported: a dense (array) matrix; deltacells reads coordinate matrices".into()))
        }
        Some(["matrix", "coordinate", field @ ("pattern" | "complex"), _]) => {
            return Err((1, format!("unsupported: {field} values; counts are integer or real").into()))
        }
        Some(["matrix", "coordinate", _, symmetry]) => {
            return Err((1, format!("unsupported: a {symmetry} matrix; counts are general").into()))
        }
        _ => return Err((1, format!("unsupported banner {:?}", String::from_utf8_lossy(&line).trim()).into())),
    }
    let mut at = 1u64;
    loop {
        if !next(&mut line)? {
            return Err((at + 1, "ends before the line of sizes".into()));
        }
        at += 1;
        let text = String::from_utf8_lossy(&line);
        let text = text.trim();
        if text.is_empty() || text.starts_with('%') {
            continue;
        }
        let sizes: Vec<u64> = text.split_whitespace().map(str::parse).collect::<Result<_, _>>().map_err(|_| {
            (at, LineProblem::from(format!("{text:?} is not the three sizes (rows, columns, entries)")))
        })?;
        let [rows, cols, entries] = sizes[..] else {
            return Err((at, format!("{text:?} is not the three sizes (rows, columns, entries)").into()));
        };
        if rows > u64::from(u32::MAX) || cols > u64::from(u32::MAX) {
            return Err((
                at,
                format!("{rows} x {cols} is larger than deltacells stores (2^32-1 cells or genes)").into(),
            ));
        }
        return Ok(Header { rows, cols, entries, first_line: at + 1 });
    }
}

/// The entries of a matrix, sorted by cell, in an unnamed temporary file.
pub(super) struct Parsed {
    /// Each cell's first entry, and the end (n_cells + 1 values).
    pub(super) indptr: Vec<u64>,
    pub(super) file: std::fs::File,
}

/// One entry of the matrix, as kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Entry {
    pub(super) cell: u32,
    pub(super) gene: u32,
    pub(super) value: f64,
}

impl Entry {
    fn bytes(&self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[..4].copy_from_slice(&self.cell.to_le_bytes());
        b[4..8].copy_from_slice(&self.gene.to_le_bytes());
        b[8..].copy_from_slice(&self.value.to_le_bytes());
        b
    }

    pub(super) fn from_bytes(b: &[u8]) -> Entry {
        let word = |r: Range<usize>| u32::from_le_bytes(b[r].try_into().unwrap_or_default());
        Entry { cell: word(0..4), gene: word(4..8), value: f64::from_le_bytes(b[8..16].try_into().unwrap_or_default()) }
    }
}

/// The fields of an entry's line: row, column (1-based) and value.
fn parse_entry(line: &[u8]) -> Option<(u64, u64, f64)> {
    let mut fields = line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty());
    let int = |f: &[u8]| -> Option<u64> {
        if f.is_empty() || f.len() > 19 || !f.iter().all(u8::is_ascii_digit) {
            return None;
        }
        Some(f.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0')))
    };
    let row = int(fields.next()?)?;
    let col = int(fields.next()?)?;
    let v = fields.next()?;
    let value = match int(v) {
        Some(n) if n < (1 << 53) => n as f64,
        _ => std::str::from_utf8(v).ok()?.parse::<f64>().ok()?,
    };
    if fields.next().is_some() {
        return None;
    }
    Some((row, col, value))
}

/// Parses every entry of the matrix (whose header `header` was read from the
/// start of `stream`) and keeps them sorted by cell.
pub(super) fn parse(
    mut stream: Box<dyn BufRead + Send>,
    header: Header,
    orientation: Orientation,
    n_cells: u64,
    run_entries: usize,
) -> Result<Parsed, LineError> {
    let temp = |e: std::io::Error| (0, LineProblem::Temporary(e));
    let mut file = std::io::BufWriter::with_capacity(1 << 20, tempfile::tempfile().map_err(temp)?);
    let mut counts = vec![0u64; n_cells as usize + 1];
    // (grown as entries come: the header's count is only a claim)
    let mut run: Vec<Entry> = Vec::new();
    // Each run's first entry in the file, and whether each run starts at or
    // after the cells of the one before (then no merge is needed).
    let mut runs: Vec<u64> = vec![0];
    let mut in_order = true;
    let mut last_cell = 0u32;
    let mut written = 0u64;
    let mut flush = |run: &mut Vec<Entry>, file: &mut std::io::BufWriter<std::fs::File>| -> Result<(), LineError> {
        if !run.is_sorted_by_key(|e| (e.cell, e.gene)) {
            run.sort_unstable_by_key(|e| (e.cell, e.gene));
        }
        if let Some(first) = run.first() {
            if first.cell < last_cell {
                in_order = false;
            }
            last_cell = run.last().map_or(last_cell, |e| e.cell);
        }
        for e in run.iter() {
            file.write_all(&e.bytes()).map_err(temp)?;
        }
        written += run.len() as u64;
        runs.push(written);
        run.clear();
        Ok(())
    };

    // Skip the header, counting lines.
    let mut line = Vec::with_capacity(64);
    let mut number = 0u64;
    while number + 1 < header.first_line {
        number += 1;
        read_line(stream.as_mut(), &mut line).map_err(|m| (number, m))?;
    }
    let mut seen = 0u64;
    let (n_rows, n_cols) = (header.rows, header.cols);
    loop {
        number += 1;
        let read = read_line(stream.as_mut(), &mut line).map_err(|m| (number, m))?;
        if read == 0 {
            break;
        }
        let text = line.trim_ascii();
        if text.is_empty() || text.starts_with(b"%") {
            continue;
        }
        let Some((r, c, value)) = parse_entry(text) else {
            return Err((
                number,
                format!("{:?} is not an entry (row, column, value)", String::from_utf8_lossy(text)).into(),
            ));
        };
        if r == 0 || r > n_rows || c == 0 || c > n_cols {
            return Err((
                number,
                format!("entry ({r}, {c}) is outside the header's {n_rows} x {n_cols} (rows and columns count from 1)")
                    .into(),
            ));
        }
        seen += 1;
        if seen > header.entries {
            return Err((number, format!("more entries than the {} the header says", header.entries).into()));
        }
        let (cell, gene) = match orientation {
            Orientation::GenesByCells => (c - 1, r - 1),
            Orientation::CellsByGenes => (r - 1, c - 1),
        };
        counts[cell as usize + 1] += 1;
        run.push(Entry { cell: cell as u32, gene: gene as u32, value });
        if run.len() >= run_entries {
            flush(&mut run, &mut file)?;
        }
    }
    if seen < header.entries {
        return Err((
            number,
            format!("the file ends after {seen} entries, but the header says {}", header.entries).into(),
        ));
    }
    flush(&mut run, &mut file)?;
    let file = file.into_inner().map_err(|e| temp(e.into_error()))?;
    for i in 1..counts.len() {
        counts[i] += counts[i - 1];
    }
    let runs: Vec<Range<u64>> = runs.windows(2).map(|w| w[0]..w[1]).filter(|r| !r.is_empty()).collect();
    let file = if in_order || runs.len() <= 1 { file } else { merge(&file, &runs).map_err(temp)? };
    Ok(Parsed { indptr: counts, file })
}

/// Merges sorted runs of entries (ranges of entries of `file`) into a new
/// temporary file.
fn merge(file: &std::fs::File, runs: &[Range<u64>]) -> std::io::Result<std::fs::File> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    // Each run is read a block at a time.
    const BLOCK: u64 = 1 << 16;
    struct Cursor {
        next: u64,
        end: u64,
        block: Vec<Entry>,
        at: usize,
    }
    let fill = |c: &mut Cursor| -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let n = (c.end - c.next).min(BLOCK);
        let mut bytes = vec![0u8; n as usize * ENTRY_BYTES];
        file.read_exact_at(&mut bytes, c.next * ENTRY_BYTES as u64)?;
        c.block = bytes.chunks_exact(ENTRY_BYTES).map(Entry::from_bytes).collect();
        c.at = 0;
        c.next += n;
        Ok(())
    };
    let mut cursors: Vec<Cursor> = Vec::with_capacity(runs.len());
    let mut heap = BinaryHeap::new();
    for (k, r) in runs.iter().enumerate() {
        let mut c = Cursor { next: r.start, end: r.end, block: Vec::new(), at: 0 };
        fill(&mut c)?;
        heap.push(Reverse((c.block[0].cell, c.block[0].gene, k)));
        cursors.push(c);
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, tempfile::tempfile()?);
    while let Some(Reverse((_, _, k))) = heap.pop() {
        let c = &mut cursors[k];
        out.write_all(&c.block[c.at].bytes())?;
        c.at += 1;
        if c.at == c.block.len() {
            if c.next == c.end {
                continue;
            }
            fill(c)?;
        }
        let e = c.block[c.at];
        heap.push(Reverse((e.cell, e.gene, k)));
    }
    out.into_inner().map_err(|e| e.into_error())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(text: &str) -> Result<Header, LineError> {
        read_header(&mut text.as_bytes())
    }

    #[test]
    fn headers_are_read_or_refused() {
        let h = header("%%MatrixMarket matrix coordinate integer general\n%comment\n3 4 5\n1 1 1\n").unwrap();
        assert_eq!(h, Header { rows: 3, cols: 4, entries: 5, first_line: 4 });
        assert!(header("%%MatrixMarket matrix coordinate real general\n\n3 4 5\n").is_ok());
        assert!(header("%%MatrixMarket matrix array real general\n3 4\n").unwrap_err().1.to_string().contains("dense"));
        assert!(header("%%MatrixMarket matrix coordinate pattern general\n")
            .unwrap_err()
            .1
            .to_string()
            .contains("pattern"));
        assert!(header("%%MatrixMarket matrix coordinate integer symmetric\n")
            .unwrap_err()
            .1
            .to_string()
            .contains("symmetric"));
        assert!(header("hello\n").unwrap_err().1.to_string().contains("not a Matrix Market"));
        assert_eq!(header("%%MatrixMarket matrix coordinate integer general\n3 4\n").unwrap_err().0, 2);
        assert!(header("%%MatrixMarket matrix coordinate integer general\n% only\n")
            .unwrap_err()
            .1
            .to_string()
            .contains("ends"));
    }

    #[test]
    fn entries_are_parsed() {
        assert_eq!(parse_entry(b"3 4 5"), Some((3, 4, 5.0)));
        assert_eq!(parse_entry(b"3\t4  2.5"), Some((3, 4, 2.5)));
        assert_eq!(parse_entry(b"3 4 -1"), Some((3, 4, -1.0)));
        assert_eq!(parse_entry(b"3 4 1e3"), Some((3, 4, 1000.0)));
        assert_eq!(parse_entry(b"3 4"), None);
        assert_eq!(parse_entry(b"3 4 5 6"), None);
        assert_eq!(parse_entry(b"-3 4 5"), None);
        assert_eq!(parse_entry(b"99999999999999999999999 4 5"), None);
    }

    /// Parses `text` (row, column, value lines of a genes x cells matrix),
    /// sorting runs of `run` entries: each cell's (gene, value) pairs.
    fn parsed(text: &str, genes: u64, cells: u64, n: u64, run: usize) -> Result<Vec<Vec<(u32, f64)>>, LineError> {
        use std::os::unix::fs::FileExt;
        let body = format!("%%MatrixMarket matrix coordinate integer general\n{genes} {cells} {n}\n{text}");
        let h = header(&body)?;
        let p = parse(Box::new(std::io::Cursor::new(body.into_bytes())), h, Orientation::GenesByCells, cells, run)?;
        let mut bytes = vec![0u8; *p.indptr.last().unwrap() as usize * ENTRY_BYTES];
        p.file.read_exact_at(&mut bytes, 0).unwrap();
        let entries: Vec<Entry> = bytes.chunks_exact(ENTRY_BYTES).map(Entry::from_bytes).collect();
        let cell = |w: &[u64]| entries[w[0] as usize..w[1] as usize].iter().map(|e| (e.gene, e.value)).collect();
        Ok(p.indptr.windows(2).map(cell).collect())
    }

    #[test]
    fn entries_in_any_order_are_sorted_by_cell() {
        let cells = parsed("2 3 7\n1 1 1\n3 1 2\n% a comment\n1 3 4\n", 3, 3, 4, RUN_ENTRIES).unwrap();
        assert_eq!(cells, vec![vec![(0, 1.0), (2, 2.0)], vec![], vec![(0, 4.0), (1, 7.0)]]);
        // In reverse cell order, in runs of 7 entries: the runs are merged.
        let (n, n_cells) = (1000u64, 30u64);
        let mut text = String::new();
        let mut want = vec![Vec::new(); n_cells as usize];
        for k in (0..n).rev() {
            let (gene, cell, value) = (k % 7, k % n_cells, k % 5 + 1);
            text.push_str(&format!("{} {} {value}\n", gene + 1, cell + 1));
            want[cell as usize].push((gene as u32, value as f64));
        }
        for run in [7, 1, n as usize] {
            let mut cells = parsed(&text, 7, n_cells, n, run).unwrap();
            for (got, want) in cells.iter_mut().zip(&mut want) {
                assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "each cell is sorted by gene");
                got.sort_by(|a, b| a.partial_cmp(b).unwrap());
                want.sort_by(|a, b| a.partial_cmp(b).unwrap());
                assert_eq!(got, want);
            }
        }
        // In cell order, in several runs: written once, not merged.
        let text: String = (0..n).map(|k| format!("{} {} 1\n", k % 7 + 1, k * n_cells / n + 1)).collect();
        let cells = parsed(&text, 7, n_cells, n, 7).unwrap();
        assert_eq!(cells.iter().map(Vec::len).sum::<usize>() as u64, n);
    }

    #[test]
    fn bad_entries_name_their_line() {
        let parsed = |text: &str, n: u64| parsed(text, 3, 3, n, RUN_ENTRIES);
        let e = parsed("1 1 1\n4 1 1\n", 2).unwrap_err();
        assert_eq!(e.0, 4);
        assert!(e.1.to_string().contains("outside the header's 3 x 3"), "{}", e.1);
        assert!(parsed("1 1 1\n", 2).unwrap_err().1.to_string().contains("ends after 1 entries"));
        assert!(parsed("1 1 1\n1 2 1\n", 1).unwrap_err().1.to_string().contains("more entries"));
        assert_eq!(parsed("1 1 x\n", 1).unwrap_err().0, 3);
    }
}
