//! ringway-sip (placeholder: being built).
