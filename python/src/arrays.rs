//! Buffers handed to NumPy without copying: decoded tiles and batches as
//! int64 / int32 arrays, pooled buffers that go back to their pool when
//! NumPy frees them, and NumPy inputs copied out before the GIL is released.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;

use deltacells::batch::FormedBatch;
use deltacells::loader::{BufferPool, FloatPool};
use deltacells::CsrMatrix;

/// A Vec<u32> as a Vec<i32>, without copying (the format's indices and counts
/// are below 2^31, so every value is the same number).
pub(crate) fn as_i32(v: Vec<u32>) -> Vec<i32> {
    let mut v = ManuallyDrop::new(v);
    // SAFETY: u32 and i32 have the same size and alignment, and every bit
    // pattern is a valid i32; the allocation is handed over whole.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<i32>(), v.len(), v.capacity()) }
}

/// A Vec<u64> as a Vec<i64>, without copying (offsets are far below 2^63).
pub(crate) fn as_i64(v: Vec<u64>) -> Vec<i64> {
    let mut v = ManuallyDrop::new(v);
    // SAFETY: as in `as_i32`, for u64 and i64.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr().cast::<i64>(), v.len(), v.capacity()) }
}

/// The cells of a NumPy int64 array (contiguous or not), copied out so that
/// the GIL can be released while they are used.
pub(crate) fn cell_vec(cells: &PyReadonlyArray1<'_, i64>) -> Vec<i64> {
    cells.as_slice().map(<[i64]>::to_vec).unwrap_or_else(|_| cells.as_array().to_vec())
}

/// A NumPy float64 array's values, copied out as `cell_vec` copies cells.
pub(crate) fn weight_vec(weights: &PyReadonlyArray1<'_, f64>) -> Vec<f64> {
    weights.as_slice().map(<[f64]>::to_vec).unwrap_or_else(|_| weights.as_array().to_vec())
}

pub(crate) type CsrArrays<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i32>>, Bound<'py, PyArray1<i32>>);

/// A matrix as CSR arrays (no copy), its indices and counts going back to
/// `pool` when NumPy lets them go.
pub(crate) fn pooled_csr<'py>(py: Python<'py>, m: CsrMatrix, pool: &Arc<BufferPool>) -> PyResult<CsrArrays<'py>> {
    Ok((as_i64(m.indptr).into_pyarray(py), pooled_array(py, m.indices, pool)?, pooled_array(py, m.data, pool)?))
}

/// Buffers kept for whole tiles: two per tile (indices and data), for a loop
/// that holds a tile or two at a time.
pub(crate) const POOLED_BUFFERS: usize = 4;

/// The owner of a pooled buffer while a NumPy array is made over it; it
/// returns the buffer to the pool when NumPy lets the array go.
#[pyclass(frozen)]
pub(crate) struct PooledBuffer {
    data: std::sync::Mutex<Vec<u32>>,
    pool: Arc<BufferPool>,
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Ok(data) = self.data.get_mut() {
            self.pool.give(std::mem::take(data));
        }
    }
}

/// [`PooledBuffer`] for a float32 buffer.
#[pyclass(frozen)]
pub(crate) struct PooledFloats {
    data: std::sync::Mutex<Vec<f32>>,
    pool: Arc<FloatPool>,
}

impl Drop for PooledFloats {
    fn drop(&mut self) {
        if let Ok(data) = self.data.get_mut() {
            self.pool.give(std::mem::take(data));
        }
    }
}

/// A NumPy float32 array over `v` (no copy), whose buffer goes back to `pool`.
pub(crate) fn pooled_floats<'py>(
    py: Python<'py>,
    v: Vec<f32>,
    pool: &Arc<FloatPool>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let (ptr, len) = (v.as_ptr(), v.len());
    let owner = Bound::new(py, PooledFloats { data: std::sync::Mutex::new(v), pool: pool.clone() })?;
    // SAFETY: as in `pooled_array`: the view covers the `len` initialized
    // entries of the buffer, which `owner` keeps unmoved for as long as the
    // array lives.
    unsafe {
        let view = numpy::ndarray::ArrayView1::from_shape_ptr(len, ptr);
        Ok(PyArray1::borrow_from_array(&view, owner.into_any()))
    }
}

/// A NumPy int32 array over `v` (no copy), whose buffer goes back to `pool`.
pub(crate) fn pooled_array<'py>(
    py: Python<'py>,
    v: Vec<u32>,
    pool: &Arc<BufferPool>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let (ptr, len) = (v.as_ptr().cast::<i32>(), v.len());
    let owner = Bound::new(py, PooledBuffer { data: std::sync::Mutex::new(v), pool: pool.clone() })?;
    // SAFETY: the view covers the `len` initialized entries of the buffer,
    // whose allocation `owner` keeps, unmoved and unchanged, for as long as
    // the array lives (NumPy holds `owner` as the array's base); u32 values
    // below 2^31 are the same i32 values.
    unsafe {
        let view = numpy::ndarray::ArrayView1::from_shape_ptr(len, ptr);
        Ok(PyArray1::borrow_from_array(&view, owner.into_any()))
    }
}

/// A batch in the form its output asked for, as NumPy arrays: (indptr,
/// indices, data, top_k, top_k_values). CSR: indptr int64, indices int32,
/// data int32 counts or float32 values. Dense: no indptr or indices, data a
/// `[cells, genes]` int32 or float32 array. top_k: `[cells, k]` int32
/// columns and float32 values, or None.
pub(crate) type FormedArrays<'py> = (
    Option<Bound<'py, PyArray1<i64>>>,
    Option<Bound<'py, PyArray1<i32>>>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
);

pub(crate) fn formed_arrays<'py>(
    py: Python<'py>,
    f: FormedBatch,
    output: &deltacells::batch::BatchOutput,
    pools: Option<(&Arc<BufferPool>, &Arc<FloatPool>)>,
) -> PyResult<FormedArrays<'py>> {
    use numpy::PyArrayMethods;
    let rows = f.rows;
    let n_cols = f.x.n_cols as usize;
    let int32 = |py: Python<'py>, v: Vec<u32>| -> PyResult<Bound<'py, PyArray1<i32>>> {
        match pools {
            Some((pool, _)) => pooled_array(py, v, pool),
            None => Ok(as_i32(v).into_pyarray(py)),
        }
    };
    let float32 = |py: Python<'py>, v: Vec<f32>| -> PyResult<Bound<'py, PyArray1<f32>>> {
        match pools {
            Some((_, pool)) => pooled_floats(py, v, pool),
            None => Ok(v.into_pyarray(py)),
        }
    };
    // The CSR buffers a dense or scaled batch used as scratch go back too.
    let mut x = f.x;
    if let Some((pool, _)) = pools {
        if output.dense {
            pool.give(std::mem::take(&mut x.indices));
        }
        if output.dense || output.scaled() {
            pool.give(std::mem::take(&mut x.data));
        }
    }
    let f = FormedBatch { x, ..f };
    let (indptr, indices, data) = if output.dense {
        let data = if output.scaled() {
            float32(py, f.values)?.reshape([rows, n_cols])?.into_any()
        } else {
            int32(py, f.dense_counts)?.reshape([rows, n_cols])?.into_any()
        };
        (None, None, data)
    } else {
        let data = if output.scaled() { float32(py, f.values)?.into_any() } else { int32(py, f.x.data)?.into_any() };
        (Some(as_i64(f.x.indptr).into_pyarray(py)), Some(int32(py, f.x.indices)?), data)
    };
    let (top_k, top_k_values) = match output.top_k {
        Some(k) => (
            Some(f.top_k.into_pyarray(py).reshape([rows, k])?.into_any()),
            Some(f.top_k_values.into_pyarray(py).reshape([rows, k])?.into_any()),
        ),
        None => (None, None),
    };
    Ok((indptr, indices, data, top_k, top_k_values))
}
