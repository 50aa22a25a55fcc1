//! Choosing the features of one type: what 10x Genomics `.h5` files and
//! Matrix Market inputs share (both hold features of several types, and a
//! conversion takes one).

use super::counts::DROPPED_COLUMN;

/// The feature type converted when none is named.
pub const GENE_EXPRESSION: &str = "Gene Expression";

/// Each feature's column among the `chosen` ones, or [`DROPPED_COLUMN`];
/// None when every feature is chosen (the columns are the features).
pub(crate) fn kept_columns(chosen: &[bool]) -> Option<Vec<u32>> {
    if chosen.iter().all(|&c| c) {
        return None;
    }
    let mut next = 0u32;
    let columns = chosen.iter().map(|&c| {
        if c {
            next += 1;
            next - 1
        } else {
            DROPPED_COLUMN
        }
    });
    Some(columns.collect())
}

/// The `values` of the `chosen` features, in order.
pub(crate) fn picked<T>(values: Vec<T>, chosen: &[bool]) -> Vec<T> {
    values.into_iter().zip(chosen).filter(|(_, &c)| c).map(|(v, _)| v).collect()
}

/// `Gene Expression (33538), Antibody Capture (17)`.
pub(crate) fn tally(values: &[String]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for v in values {
        match counts.iter_mut().find(|(n, _)| *n == v) {
            Some(c) => c.1 += 1,
            None => counts.push((v, 1)),
        }
    }
    counts.iter().map(|(n, c)| format!("{n:?} ({c})")).collect::<Vec<_>>().join(", ")
}
