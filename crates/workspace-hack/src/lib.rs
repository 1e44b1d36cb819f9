//! No code: this crate's dependencies fix the features every build of the workspace asks for
//! (see its Cargo.toml).
