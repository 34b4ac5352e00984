#!/bin/sh
# Installs what couch_workers needs on a fresh Debian/Ubuntu machine, and
# only what is missing: Erlang/OTP (with headers, EUnit and PropEr),
# rebar3, rebar 2, and libclang (bindgen, for the FoundationDB store's headers).
# Cargo is expected to be installed already (rustup). Idempotent: a second
# run installs nothing.
set -eu

SUDO=
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=sudo
    else
        echo "setup: not root and no sudo: install the packages below by hand" >&2
    fi
fi

# package -> why
need=""
have_pkg() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
want() {
    pkg=$1; why=$2
    if have_pkg "$pkg"; then
        echo "setup: $pkg is installed ($why)"
    else
        echo "setup: $pkg is missing ($why)"
        need="$need $pkg"
    fi
}

if command -v erl >/dev/null 2>&1; then
    echo "setup: erl found at $(command -v erl)"
else
    want erlang-nox "the Erlang VM"
fi
# Headers for NIFs, EUnit and PropEr come as separate Debian packages even
# when erl is present.
if command -v dpkg-query >/dev/null 2>&1; then
    want erlang-dev "erl_nif.h"
    want erlang-eunit "rebar3 eunit"
    want erlang-proper "property tests"
    want erlang-inets "the status page (app env http): OTP's httpd"
    want erlang-dialyzer "scripts/check-erlang.sh: dialyzer"
    want erlang-tools "scripts/check-erlang.sh: xref"
    want libclang-dev "bindgen (FoundationDB headers)"
    want python3 "scripts/check-layers.py; scripts/fdb-faults.sh reads fdbcli's status json; bench/peers_table.py"
fi
# CouchDB builds with rebar 2; Debian's 2.6.4 stands in for it in the
# integration test of a CouchDB-shaped tree (test/integration).
if command -v rebar >/dev/null 2>&1; then
    echo "setup: rebar found at $(command -v rebar)"
else
    want rebar "rebar 2, CouchDB's build tool"
fi
if command -v rebar3 >/dev/null 2>&1; then
    echo "setup: rebar3 found at $(command -v rebar3)"
else
    want rebar3 "the build tool"
fi

if [ -n "$need" ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "setup: no apt-get: install$need by hand" >&2
        exit 1
    fi
    echo "setup: apt-get update"
    $SUDO apt-get update
    echo "setup: apt-get install -y$need"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y $need
else
    echo "setup: nothing to install"
fi

if command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo found: $(cargo --version)"
else
    echo "setup: cargo is missing: install Rust with rustup (https://rustup.rs)" >&2
    exit 1
fi
# need_component COMPONENT SUBCOMMAND: the cargo SUBCOMMAND a rustup
# COMPONENT brings, added with rustup where it is missing (a minimal
# rustup profile has neither clippy nor rustfmt).
need_component() {
    if cargo "$2" --version >/dev/null 2>&1; then
        echo "setup: $1 found: $(cargo "$2" --version)"
    elif command -v rustup >/dev/null 2>&1; then
        echo "setup: rustup component add $1"
        rustup component add "$1"
    else
        echo "setup: cargo $2 is missing and there is no rustup to add $1" >&2
        exit 1
    fi
}
# The FDB type-check runs clippy; scripts/test.sh checks the Rust
# formatting (rustfmt.toml).
need_component clippy clippy
need_component rustfmt fmt
echo "setup: done. Next: rebar3 compile && rebar3 eunit"
