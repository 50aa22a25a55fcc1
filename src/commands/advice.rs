//! What to type: the library's errors state what is wrong, and the command
//! line adds the flag or command that gets past it, so that the same error
//! met from Python never tells its reader to type a flag.

use crate::convert::genes::GeneError;
use crate::convert::obs_merge::ObsMergeError;
use crate::convert::{AppendError, ConvertError};
use crate::inputs::InputError;
use crate::DatasetError;

/// The command an error happened in, when the advice depends on it: given
/// as the error's context (`.context(Step::Append)`, which reads `append`),
/// and found again by type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Append,
    Compact,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Append => f.write_str("append"),
            Step::Compact => f.write_str("compact"),
        }
    }
}

/// The advice for the first error in `err`'s chain that has one. A
/// conversion's error is looked into: the advice for an input's or an obs
/// column's error is the same whichever step met it.
pub(crate) fn advice(err: &anyhow::Error) -> Option<String> {
    // An append keeps the dataset's obs columns and genes: convert's flags
    // that choose them are not append's.
    let appending = err.downcast_ref::<Step>() == Some(&Step::Append);
    err.chain().find_map(|cause| match cause.downcast_ref::<ConvertError>() {
        Some(e) => match e.part() {
            Some(part) => of_part(part, appending),
            None => conversion(e),
        },
        None => of_part(cause, appending),
    })
}

/// The advice for a conversion's own failures.
fn conversion(e: &ConvertError) -> Option<String> {
    Some(match e {
        ConvertError::NotEmpty { .. } => "use --overwrite to replace the dataset in it".into(),
        ConvertError::NoPlan { root, .. } => format!("run `deltacells plan INPUTS... {root}` first"),
        ConvertError::ShardResult { root, shard, shards, .. } => {
            format!("re-run `deltacells shard {root} --shard {shard}/{shards}`")
        }
        ConvertError::Totals { totals, .. } => format!(
            "run `deltacells plan --totals-shard K/N` with this plan's inputs and options, or remove {totals} \
             to sum them here"
        ),
        _ => return None,
    })
}

/// The advice for the error of a part a conversion uses, or of the reader.
fn of_part(cause: &(dyn std::error::Error + 'static), appending: bool) -> Option<String> {
    if let Some(e) = cause.downcast_ref::<ObsMergeError>() {
        if appending {
            return Some(
                "an append keeps the dataset's obs columns: every input must have each of them, of the same kind"
                    .into(),
            );
        }
        return Some(obs_merge(e));
    }
    if let Some(e) = cause.downcast_ref::<InputError>() {
        return input(e);
    }
    if let Some(GeneError::Differ(_)) = cause.downcast_ref::<GeneError>() {
        if appending {
            return Some("an append keeps the dataset's genes: every input must have each of them".into());
        }
        return Some(
            "every input must have the same genes (keep the genes every input has with --genes \
             intersection, or all of them with --genes union)"
                .into(),
        );
    }
    if let Some(e) = cause.downcast_ref::<AppendError>() {
        return append(e);
    }
    match cause.downcast_ref::<DatasetError>() {
        Some(DatasetError::AppendUnfinished { location }) => {
            Some(format!("complete it with `deltacells append --resume {location}`"))
        }
        Some(DatasetError::Unfinished { location }) => Some(format!(
            "finish it with `deltacells shard {location} --shard K/N` for each shard whose result is missing \
             (a single convert is shard 0/1) and then `deltacells finalize {location}`, or convert again with \
             --overwrite"
        )),
        _ => None,
    }
}

fn append(e: &AppendError) -> Option<String> {
    match e {
        AppendError::Interrupted { location, .. } => {
            Some(format!("complete it with `deltacells append --resume {location}`"))
        }
        AppendError::NoSourceColumns { .. } => {
            Some("append without --shuffle, or convert every input again with --shuffle, the new ones with them".into())
        }
        AppendError::Unfinished { location, .. } => {
            Some(format!("complete it with `deltacells append --resume {location}` first"))
        }
        AppendError::Busy { .. } => None,
        AppendError::Planned { location, .. } => Some(format!(
            "run `deltacells finalize {location}` once the shards of plan --append are done, or remove its .append \
             folder to discard it"
        )),
    }
}

fn obs_merge(e: &ObsMergeError) -> String {
    match e {
        ObsMergeError::Missing { column, .. }
        | ObsMergeError::Extra { column, .. }
        | ObsMergeError::Kinds { column, .. }
        | ObsMergeError::Unstorable { column, .. } => format!("leave it out with --obs-exclude {column}"),
        ObsMergeError::SourceTaken { column } => format!("rename it, or leave it out with --obs-exclude {column}"),
        ObsMergeError::UnknownExclude { .. } => "check the names given to --obs-exclude".into(),
        ObsMergeError::NoObs { .. } => "use --no-obs to convert without obs".into(),
        ObsMergeError::ObsNamesTaken { .. } => "use --no-obs-names or --obs-exclude obs_names".into(),
    }
}

fn input(e: &InputError) -> Option<String> {
    match e {
        InputError::ColumnType { table, column, .. } if table == "obs" => {
            Some(format!("leave the column out with --obs-exclude {column} (or all of obs with --no-obs)"))
        }
        InputError::ColumnType { .. } => Some("leave the gene table out with --no-var".into()),
        InputError::BadCount(bad) => bad.counts_in.as_ref().map(|m| format!("use --matrix {m}")),
        _ => None,
    }
}
