//! placeholder (owned by the embedded-store helper)
