//! `.h5ad` (and 10x `.h5`) inputs in buckets and on HTTP servers: an HDF5
//! virtual file driver whose reads go through the ranged files of inputs at
//! URLs ([`crate::inputs::remote`]: block cache, read-ahead, prefetcher), so
//! that a worker fetches only the HDF5 metadata and the parts of X and obs
//! that hold its cells. Its structs follow H5FDdevelop.h of the HDF5 that
//! hdf5-metno-src builds (2.x): the crate's own bindings of them are older.
//!
//! HDF5 serializes every call behind one lock, so the driver's callbacks run
//! one at a time; the background fetches only fill the block cache.

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use hdf5_sys::h5::{haddr_t, herr_t, hsize_t};
use hdf5_sys::h5i::hid_t;

use crate::inputs::error::{Cause, Hdf5Error};
use crate::inputs::remote::{Failure, RangedFile, ReadOf};

/// `H5L_info2_t`, with its union as plain bytes (the crate keeps the token private).
#[repr(C)]
struct LinkInfo {
    kind: c_int,
    corder_valid: bool,
    corder: i64,
    cset: c_int,
    token: Token,
}

/// `H5O_token_t`: an object's address in the native file format.
#[repr(C)]
#[derive(Clone, Copy)]
struct Token {
    data: [u64; 2],
}

unsafe extern "C" {
    fn H5Lget_info2(loc_id: hid_t, name: *const c_char, info: *mut LinkInfo, lapl_id: hid_t) -> herr_t;
    fn H5VLnative_token_to_addr(loc_id: hid_t, token: Token, addr: *mut haddr_t) -> herr_t;
}

/// The address of the object header that the hard link `name` of `file`
/// points to, read from the link alone (the header itself is not read), or
/// None.
pub(crate) fn header_address(file: &hdf5::File, name: &str) -> Option<u64> {
    let name = CString::new(name).ok()?;
    hdf5::sync::sync(|| {
        let id = file.id();
        // SAFETY: plain HDF5 calls on an open file; `info` is a LinkInfo
        // laid out as H5L_info2_t, written by H5Lget_info2.
        unsafe {
            if hdf5_sys::h5l::H5Lexists(id, name.as_ptr(), hdf5_sys::h5p::H5P_DEFAULT) <= 0 {
                return None;
            }
            let mut info = std::mem::MaybeUninit::<LinkInfo>::zeroed();
            if H5Lget_info2(id, name.as_ptr(), info.as_mut_ptr(), hdf5_sys::h5p::H5P_DEFAULT) < 0 {
                return None;
            }
            let info = info.assume_init();
            if info.kind != 0 {
                return None; // not a hard link (H5L_TYPE_HARD)
            }
            let mut addr: haddr_t = 0;
            (H5VLnative_token_to_addr(id, info.token, &mut addr) >= 0).then_some(addr)
        }
    })
}

/// `H5FD_t`: the fields HDF5 keeps in every open file of a driver.
#[repr(C)]
struct FileBase {
    driver_id: hid_t,
    cls: *const DriverClass,
    fileno: c_ulong,
    access_flags: c_uint,
    feature_flags: c_ulong,
    maxaddr: haddr_t,
    base_addr: haddr_t,
    threshold: hsize_t,
    alignment: hsize_t,
    paged_aggr: bool,
}

/// An open file of this driver: HDF5's part first.
#[repr(C)]
struct DriverFile {
    base: FileBase,
    file: *const RangedFile,
    eoa: haddr_t,
}

type Unused = Option<unsafe extern "C" fn()>;

/// `H5FD_class_t`.
#[repr(C)]
struct DriverClass {
    version: c_uint,
    value: c_int,
    name: *const c_char,
    maxaddr: haddr_t,
    fc_degree: c_int,
    terminate: Unused,
    sb_size: Unused,
    sb_encode: Unused,
    sb_decode: Unused,
    fapl_size: usize,
    fapl_get: Unused,
    fapl_copy: Unused,
    fapl_free: Unused,
    dxpl_size: usize,
    dxpl_copy: Unused,
    dxpl_free: Unused,
    open: Option<unsafe extern "C" fn(*const c_char, c_uint, hid_t, haddr_t) -> *mut DriverFile>,
    close: Option<unsafe extern "C" fn(*mut DriverFile) -> herr_t>,
    cmp: Unused,
    query: Option<unsafe extern "C" fn(*const DriverFile, *mut c_ulong) -> herr_t>,
    get_type_map: Unused,
    alloc: Unused,
    free: Unused,
    get_eoa: Option<unsafe extern "C" fn(*const DriverFile, c_int) -> haddr_t>,
    set_eoa: Option<unsafe extern "C" fn(*mut DriverFile, c_int, haddr_t) -> herr_t>,
    get_eof: Option<unsafe extern "C" fn(*const DriverFile, c_int) -> haddr_t>,
    get_handle: Unused,
    read: Option<unsafe extern "C" fn(*mut DriverFile, c_int, hid_t, haddr_t, usize, *mut c_void) -> herr_t>,
    write: Option<unsafe extern "C" fn(*mut DriverFile, c_int, hid_t, haddr_t, usize, *const c_void) -> herr_t>,
    read_vector: Unused,
    write_vector: Unused,
    read_selection: Unused,
    write_selection: Unused,
    flush: Unused,
    truncate: Unused,
    lock: Unused,
    unlock: Unused,
    del: Unused,
    ctl: Unused,
    fl_map: [c_int; 7],
}

// SAFETY: the class is immutable (a static of plain values and function
// pointers) and only read by HDF5, so sharing it between threads is sound.
unsafe impl Sync for DriverClass {}

const H5FD_MEM_SUPER: c_int = 1;

const H5FD_MEM_DRAW: c_int = 3;

static CLASS: DriverClass = DriverClass {
    version: 1,
    value: 512 + 0x6463, // a driver of our own: above H5_VFD_RESERVED
    name: c"deltacells_ranged".as_ptr(),
    maxaddr: i64::MAX as haddr_t,
    fc_degree: 1, // H5F_CLOSE_WEAK
    terminate: None,
    sb_size: None,
    sb_encode: None,
    sb_decode: None,
    fapl_size: 0,
    fapl_get: None,
    fapl_copy: None,
    fapl_free: None,
    dxpl_size: 0,
    dxpl_copy: None,
    dxpl_free: None,
    open: Some(driver_open),
    close: Some(driver_close),
    cmp: None,
    query: Some(driver_query),
    get_type_map: None,
    alloc: None,
    free: None,
    get_eoa: Some(driver_get_eoa),
    set_eoa: Some(driver_set_eoa),
    get_eof: Some(driver_get_eof),
    get_handle: None,
    read: Some(driver_read),
    write: Some(driver_write),
    read_vector: None,
    write_vector: None,
    read_selection: None,
    write_selection: None,
    flush: None,
    truncate: None,
    lock: None,
    unlock: None,
    del: None,
    ctl: None,
    // H5FD_FLMAP_DICHOTOMY
    fl_map: [
        H5FD_MEM_SUPER,
        H5FD_MEM_SUPER,
        H5FD_MEM_SUPER,
        H5FD_MEM_DRAW,
        H5FD_MEM_DRAW,
        H5FD_MEM_SUPER,
        H5FD_MEM_SUPER,
    ],
};

/// The file being opened: H5Fopen calls the driver's open on this thread,
/// under HDF5's lock, before it returns.
static OPENING: Mutex<Option<Arc<RangedFile>>> = Mutex::new(None);

unsafe extern "C" fn driver_open(
    _name: *const c_char,
    _flags: c_uint,
    _fapl: hid_t,
    _maxaddr: haddr_t,
) -> *mut DriverFile {
    let Some(file) = OPENING.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
        return std::ptr::null_mut();
    };
    let base = FileBase {
        driver_id: 0,
        cls: std::ptr::null(),
        fileno: 0,
        access_flags: 0,
        feature_flags: 0,
        maxaddr: 0,
        base_addr: 0,
        threshold: 0,
        alignment: 0,
        paged_aggr: false,
    };
    Box::into_raw(Box::new(DriverFile { base, file: Arc::into_raw(file), eoa: 0 }))
}

unsafe extern "C" fn driver_close(f: *mut DriverFile) -> herr_t {
    if f.is_null() {
        return -1;
    }
    // SAFETY: `f` is a DriverFile that driver_open made, closed once by HDF5.
    let f = unsafe { Box::from_raw(f) };
    // SAFETY: the Arc that driver_open leaked into it.
    drop(unsafe { Arc::from_raw(f.file) });
    0
}

unsafe extern "C" fn driver_query(_f: *const DriverFile, flags: *mut c_ulong) -> herr_t {
    if !flags.is_null() {
        // SAFETY: HDF5 passes a valid pointer to write the flags to.
        unsafe { *flags = 0 };
    }
    0
}

unsafe extern "C" fn driver_get_eoa(f: *const DriverFile, _kind: c_int) -> haddr_t {
    // SAFETY: `f` is an open DriverFile.
    unsafe { (*f).eoa }
}

unsafe extern "C" fn driver_set_eoa(f: *mut DriverFile, _kind: c_int, addr: haddr_t) -> herr_t {
    // SAFETY: `f` is an open DriverFile.
    unsafe { (*f).eoa = addr };
    0
}

unsafe extern "C" fn driver_get_eof(f: *const DriverFile, _kind: c_int) -> haddr_t {
    // SAFETY: `f` is an open DriverFile whose RangedFile lives as long as it.
    unsafe { (*(*f).file).size() }
}

unsafe extern "C" fn driver_read(
    f: *mut DriverFile,
    kind: c_int,
    _dxpl: hid_t,
    addr: haddr_t,
    size: usize,
    buf: *mut c_void,
) -> herr_t {
    if f.is_null() || (buf.is_null() && size > 0) || addr.checked_add(size as u64).is_none() {
        return -1;
    }
    // SAFETY: HDF5 passes a buffer of `size` writable bytes.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), size) };
    // A clone of the Arc the open file holds, for the background fetches.
    // SAFETY: the pointer came from Arc::into_raw and the file keeps it alive.
    let file = unsafe {
        Arc::increment_strong_count((*f).file);
        Arc::from_raw((*f).file)
    };
    // (HDF5 reads a heap of strings as raw data, the rest of its metadata
    // with the kinds of its free-list map, none of them DRAW.)
    let of = if kind == H5FD_MEM_DRAW { ReadOf::Data } else { ReadOf::Structure };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| file.read(addr, out, of)));
    match result {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            file.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(Failure(Arc::new(e)));
            -1
        }
        Err(_) => {
            let panicked: Cause = "a read panicked".into();
            file.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(Failure(Arc::from(panicked)));
            -1
        }
    }
}

unsafe extern "C" fn driver_write(
    _f: *mut DriverFile,
    _kind: c_int,
    _dxpl: hid_t,
    _addr: haddr_t,
    _size: usize,
    _buf: *const c_void,
) -> herr_t {
    -1 // read-only
}

/// The driver's id, registered once.
fn driver_id() -> Result<hid_t, Cause> {
    static ID: OnceLock<hid_t> = OnceLock::new();
    let id = *ID.get_or_init(|| {
        hdf5::sync::sync(|| {
            // SAFETY: CLASS is a valid, 'static driver class.
            unsafe { hdf5_sys::h5fd::H5FDregister((&raw const CLASS).cast()) }
        })
    });
    if id < 0 {
        return Err("cannot register deltacells' ranged-read HDF5 driver".into());
    }
    Ok(id)
}

/// Opens the HDF5 file at `url` read-only, through the ranged-read driver.
/// The error is HDF5's, or the store's when a read under HDF5 failed.
pub(crate) fn open_hdf5(url: &str, file: &Arc<RangedFile>) -> Result<hdf5::File, Cause> {
    let driver = driver_id()?;
    // The name is for HDF5's own messages only (the driver reads `file`).
    let name = CString::new(crate::redact::redact(url).into_owned()).map_err(|_| Cause::from("a NUL in the URL"))?;
    let id = hdf5::sync::sync(|| {
        *OPENING.lock().unwrap_or_else(|e| e.into_inner()) = Some(file.clone());
        // SAFETY: plain HDF5 calls on a property list this function owns.
        let id = unsafe {
            let fapl = hdf5_sys::h5p::H5Pcreate(*hdf5::globals::H5P_FILE_ACCESS);
            let mut id = -1;
            if fapl >= 0 {
                if hdf5_sys::h5p::H5Pset_driver(fapl, driver, std::ptr::null()) >= 0 {
                    id = hdf5_sys::h5f::H5Fopen(name.as_ptr(), hdf5_sys::h5f::H5F_ACC_RDONLY, fapl);
                }
                hdf5_sys::h5p::H5Pclose(fapl);
            }
            id
        };
        *OPENING.lock().unwrap_or_else(|e| e.into_inner()) = None;
        id
    });
    if id < 0 {
        return Err(match file.failure() {
            Some(failure) => Box::new(failure),
            None => "not an HDF5 file, or truncated".into(),
        });
    }
    // SAFETY: `id` is a file id H5Fopen just returned, owned by nothing else.
    unsafe { hdf5::from_id::<hdf5::File>(id) }.map_err(|e| Box::new(Hdf5Error::new(e)) as Cause)
}
