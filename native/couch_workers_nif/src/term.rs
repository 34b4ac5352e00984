//! Small term helpers shared by the NIF modules.

use rustler::types::atom::Atom;
use rustler::{Binary, Encoder, Env, Error, NewBinary, NifResult, Term};

use crate::atoms;

/// A binary holding `bytes` (a `Vec<u8>` would encode as a list).
pub fn binary<'a>(env: Env<'a>, bytes: &[u8]) -> Term<'a> {
    let mut bin = NewBinary::new(env, bytes.len());
    bin.as_mut_slice().copy_from_slice(bytes);
    bin.into()
}

/// The atom named `name` (created if needed: names come from this crate
/// and the core, never from user data).
pub fn atom<'a>(env: Env<'a>, name: &str) -> Term<'a> {
    match Atom::from_str(env, name) {
        Ok(a) => a.encode(env),
        // Only a name over 255 characters fails; none of ours is.
        Err(_) => atoms::error().encode(env),
    }
}

/// `{error, Name}`.
pub fn error_tuple<'a>(env: Env<'a>, name: &str) -> Term<'a> {
    (atoms::error(), atom(env, name)).encode(env)
}

/// The bytes of a binary argument; `badarg` for anything else.
pub fn bytes_arg<'a>(term: Term<'a>) -> NifResult<&'a [u8]> {
    if !term.is_binary() {
        return Err(Error::BadArg);
    }
    let bin: Binary<'a> = term.decode()?;
    Ok(bin.as_slice())
}
