//! SIP digest authentication (RFC 3261 22, RFC 7616, RFC 8760), sans-IO:
//! the digest computation ([`Algorithm`]), credentials headers
//! ([`Credentials`]), stateless HMAC-signed nonces ([`NonceKey`]), replay
//! protection ([`ReplayTable`]) and where HA1s come from
//! ([`CredentialStore`], [`HtdigestCredentials`]). The proxy uses them in
//! `proxy::auth`.

mod credentials;
mod digest;
mod header;
mod nonce;
mod replay;

pub use credentials::{
    CredentialStore, CredentialsFileError, CredentialsUnavailable, HtdigestCredentials,
};
pub use digest::{Algorithm, Hex};
pub use header::{Credentials, CredentialsError};
pub use nonce::{NonceCheck, NonceKey, CLOCK_SKEW, NONCE_LEN};
pub use replay::{ReplayCheck, ReplayTable};
