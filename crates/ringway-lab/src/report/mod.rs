//! Reports (being built).
