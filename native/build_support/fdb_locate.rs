// Where libfdb_c.so is, for the build scripts of the crates that link it
// (the core's tests and examples, the NIF, the command line) when their
// `fdb` feature is on: included by each `build.rs`, so that the search is
// written once. The same order as scripts/fdb-env.sh:
//
// 1. `FDB_CLIENT_LIB_PATH` (the foundationdb crate's own variable; the
//    scripts set it from what they found);
// 2. `COUCH_WORKERS_FDB_DIR/lib`;
// 3. an installed FoundationDB (the official packages put libfdb_c.so in
//    /usr/lib, where the linker and the loader look anyway: no path);
// 4. `../shared/fdb/lib` beside the repository.
//
// A directory found is passed to the linker (`-L`) and recorded as the
// rpath of what is linked, so the binaries run with no ldconfig and no
// LD_LIBRARY_PATH.

fn fdb_lib_dir() -> Option<std::path::PathBuf> {
    use std::path::{Path, PathBuf};
    for var in ["FDB_CLIENT_LIB_PATH", "COUCH_WORKERS_FDB_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let has_lib = |d: &Path| d.join("libfdb_c.so").is_file();
    if let Some(d) = std::env::var_os("FDB_CLIENT_LIB_PATH").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("COUCH_WORKERS_FDB_DIR").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(d).join("lib"));
    }
    let installed = ["/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib"];
    if installed.iter().any(|d| has_lib(Path::new(d))) {
        return None;
    }
    // CARGO_MANIFEST_DIR is native/<crate>: the repository is two up.
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let shared = manifest.join("../../../shared/fdb/lib");
    if has_lib(&shared) {
        return Some(shared.canonicalize().unwrap_or(shared));
    }
    println!(
        "cargo:warning=libfdb_c.so not found (FDB_CLIENT_LIB_PATH, COUCH_WORKERS_FDB_DIR, /usr/lib, ../shared/fdb): \
         install FoundationDB's client package or set COUCH_WORKERS_FDB_DIR"
    );
    None
}

/// Emits the search path and rpath when the crate's `fdb` feature is on.
fn link_fdb() {
    if std::env::var_os("CARGO_FEATURE_FDB").is_none() {
        return;
    }
    // None: installed where the linker and loader look, or not found (said).
    if let Some(dir) = fdb_lib_dir() {
        let dir = dir.display();
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
