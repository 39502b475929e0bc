//! ringway-reorder (placeholder: being built).
