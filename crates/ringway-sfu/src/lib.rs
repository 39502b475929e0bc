//! ringway-sfu (placeholder: being built).
