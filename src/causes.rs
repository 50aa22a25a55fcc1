//! Causes kept as the values they are under deltacells' errors, for the
//! errors whose source is another library's or the system's: printed once by
//! [`crate::error_chain`], reachable by `source()`.

/// The error of a library or of the system under one of deltacells' errors,
/// kept as the value it is so that `source()` walks to it.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A library's error that prints its causes in its own text (zarrs's do):
/// printed as it is, with no `source()`, so that no cause prints twice. The
/// error itself is the field.
#[derive(Debug)]
pub struct Whole<E>(pub E);

impl<E: std::fmt::Display> std::fmt::Display for Whole<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for Whole<E> {}

/// A [`Whole`] error with what to do about it after its text (`text; advice`).
#[derive(Debug)]
pub struct Advised<E> {
    pub error: E,
    pub advice: &'static str,
}

impl<E: std::fmt::Display> std::fmt::Display for Advised<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.error, self.advice)
    }
}

impl<E: std::fmt::Debug + std::fmt::Display> std::error::Error for Advised<E> {}

/// What failed (`is not JSON`), with the error of why as its source.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct Context {
    pub what: String,
    #[source]
    pub source: Cause,
}

impl Context {
    pub fn new(what: impl Into<String>, source: impl Into<Cause>) -> Context {
        Context { what: what.into(), source: source.into() }
    }
}
