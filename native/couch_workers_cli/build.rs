//! Links libfdb_c where it was found when the `fdb` feature is on.
include!("../build_support/fdb_locate.rs");

fn main() {
    link_fdb();
}
