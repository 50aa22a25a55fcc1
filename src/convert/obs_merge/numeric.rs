//! The numeric types of obs columns that several inputs hold: the code type
//! of a vocabulary, the common type of two, and arrays widened to it.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array};
use arrow_schema::DataType;

/// The code type for a vocabulary (decisions.md 16, the pandas rule).
pub(super) fn code_type(n: usize) -> DataType {
    if n < 127 {
        DataType::Int8
    } else if n < 32767 {
        DataType::Int16
    } else {
        DataType::Int32
    }
}

fn int_width(dt: &DataType) -> Option<(bool, u32)> {
    Some(match dt {
        DataType::Int8 => (true, 8),
        DataType::Int16 => (true, 16),
        DataType::Int32 => (true, 32),
        DataType::Int64 => (true, 64),
        DataType::UInt8 => (false, 8),
        DataType::UInt16 => (false, 16),
        DataType::UInt32 => (false, 32),
        DataType::UInt64 => (false, 64),
        _ => return None,
    })
}

fn signed(bits: u32) -> DataType {
    match bits {
        8 => DataType::Int8,
        16 => DataType::Int16,
        32 => DataType::Int32,
        _ => DataType::Int64,
    }
}

fn unsigned(bits: u32) -> DataType {
    match bits {
        8 => DataType::UInt8,
        16 => DataType::UInt16,
        32 => DataType::UInt32,
        _ => DataType::UInt64,
    }
}

/// The common numeric type of two (decisions.md 19: integers that meet floats
/// become double).
pub(super) fn common_numeric(a: &DataType, b: &DataType) -> DataType {
    if a == b {
        return a.clone();
    }
    match (int_width(a), int_width(b)) {
        (Some((sa, wa)), Some((sb, wb))) if sa == sb => {
            if sa {
                signed(wa.max(wb))
            } else {
                unsigned(wa.max(wb))
            }
        }
        (Some((sa, wa)), Some((_, wb))) => {
            let (unsigned_bits, signed_bits) = if sa { (wb, wa) } else { (wa, wb) };
            if unsigned_bits >= 64 {
                DataType::Float64
            } else {
                signed((unsigned_bits * 2).max(signed_bits))
            }
        }
        _ if *a == DataType::Float32 && *b == DataType::Float32 => DataType::Float32,
        _ => DataType::Float64,
    }
}

/// An integer column's values as i64 (None for missing), or None when it
/// is not of an integer type that i64 holds.
pub(crate) fn numeric_as_i64(a: &ArrayRef) -> Option<Vec<Option<i64>>> {
    macro_rules! ints {
        ($t:ty) => {
            a.as_primitive_opt::<$t>().map(|p| p.iter().map(|v| v.map(|x| x as i64)).collect())
        };
    }
    ints!(Int8Type)
        .or_else(|| ints!(Int16Type))
        .or_else(|| ints!(Int32Type))
        .or_else(|| ints!(Int64Type))
        .or_else(|| ints!(UInt8Type))
        .or_else(|| ints!(UInt16Type))
        .or_else(|| ints!(UInt32Type))
}

fn numeric_as_f64(a: &ArrayRef) -> Vec<Option<f64>> {
    macro_rules! floats {
        ($t:ty) => {
            a.as_primitive_opt::<$t>().map(|p| p.iter().map(|v| v.map(|x| x as f64)).collect::<Vec<_>>())
        };
    }
    floats!(Float32Type)
        .or_else(|| floats!(Float64Type))
        .or_else(|| floats!(UInt64Type))
        .or_else(|| numeric_as_i64(a).map(|v| v.into_iter().map(|x| x.map(|x| x as f64)).collect()))
        .unwrap_or_default()
}

/// Widens a numeric array to the planned type (the plan only ever widens).
pub(super) fn widen(a: ArrayRef, to: &DataType) -> Result<ArrayRef, String> {
    if a.data_type() == to {
        return Ok(a);
    }
    let ints = || numeric_as_i64(&a).ok_or_else(|| format!("cannot widen {} to {to}", a.data_type()));
    Ok(match to {
        DataType::Float64 => Arc::new(Float64Array::from(numeric_as_f64(&a))),
        DataType::Float32 => {
            Arc::new(numeric_as_f64(&a).into_iter().map(|v| v.map(|x| x as f32)).collect::<Float32Array>())
        }
        DataType::Int16 => Arc::new(ints()?.into_iter().map(|v| v.map(|x| x as i16)).collect::<Int16Array>()),
        DataType::Int32 => Arc::new(ints()?.into_iter().map(|v| v.map(|x| x as i32)).collect::<Int32Array>()),
        DataType::Int64 => Arc::new(ints()?.into_iter().collect::<Int64Array>()),
        DataType::UInt16 => {
            Arc::new(ints()?.into_iter().map(|v| v.map(|x| x as u16)).collect::<arrow_array::UInt16Array>())
        }
        DataType::UInt32 => {
            Arc::new(ints()?.into_iter().map(|v| v.map(|x| x as u32)).collect::<arrow_array::UInt32Array>())
        }
        DataType::UInt64 => {
            Arc::new(ints()?.into_iter().map(|v| v.map(|x| x as u64)).collect::<arrow_array::UInt64Array>())
        }
        other => return Err(format!("cannot widen {} to {other}", a.data_type())),
    })
}
