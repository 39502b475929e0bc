//! Where passwords come from: the [`CredentialStore`] trait (so a shared
//! store can back it later) and [`HtdigestCredentials`], parsed from an
//! htdigest-style file. Passwords are never stored, only HA1 =
//! H(user ":" realm ":" password).

use super::digest::{Algorithm, Hex};
use std::collections::HashMap;
use std::fmt;

/// A credential store could not answer (a shared store down).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialsUnavailable(pub String);

impl fmt::Display for CredentialsUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "credential store unavailable: {}", self.0)
    }
}

impl std::error::Error for CredentialsUnavailable {}

/// HA1 values by user, realm and algorithm, shared by all workers.
pub trait CredentialStore: Send + Sync {
    /// HA1 of `username` in `realm` for `algorithm`; `Ok(None)` if there
    /// is none (unknown user, or no HA1 for that algorithm).
    fn ha1(
        &self,
        username: &str,
        realm: &str,
        algorithm: Algorithm,
    ) -> Result<Option<Hex>, CredentialsUnavailable>;
}

/// A line of a credentials file that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CredentialsFileError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for CredentialsFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for CredentialsFileError {}

/// Credentials from an htdigest-style text: one `user:realm:HA1` per line
/// (Apache `htdigest` writes MD5 lines). The HA1's length says its
/// algorithm: 32 hex digits MD5, 64 SHA-256; a user may have one line of
/// each. `#` starts a comment line; blank lines are skipped.
#[derive(Clone, Debug, Default)]
pub struct HtdigestCredentials {
    entries: HashMap<(String, String, Algorithm), Hex>,
}

impl HtdigestCredentials {
    /// Parse the file's text.
    pub fn parse(text: &str) -> Result<HtdigestCredentials, CredentialsFileError> {
        let mut entries = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fail = |message: String| CredentialsFileError {
                line: index + 1,
                message,
            };
            let mut fields = line.split(':');
            let (Some(user), Some(realm), Some(ha1), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(fail("expected user:realm:HA1".into()));
            };
            if user.is_empty() || realm.is_empty() {
                return Err(fail("empty user or realm".into()));
            }
            let algorithm = match ha1.len() {
                32 => Algorithm::Md5,
                64 => Algorithm::Sha256,
                n => {
                    return Err(fail(format!(
                        "HA1 of {n} characters (32 hex digits for MD5, 64 for SHA-256)"
                    )))
                }
            };
            if !ha1.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(fail("HA1 is not hexadecimal".into()));
            }
            let key = (user.to_owned(), realm.to_owned(), algorithm);
            let value = Hex::of(&decode(ha1));
            if entries.insert(key, value).is_some() {
                return Err(fail(format!(
                    "second {algorithm} HA1 for {user} in realm {realm}"
                )));
            }
        }
        Ok(HtdigestCredentials { entries })
    }

    /// Add a user with a clear-text password (tests, tools): both HA1s.
    pub fn add_password(&mut self, username: &str, realm: &str, password: &str) {
        for algorithm in [Algorithm::Md5, Algorithm::Sha256] {
            self.entries.insert(
                (username.to_owned(), realm.to_owned(), algorithm),
                algorithm.ha1(username, realm, password),
            );
        }
    }

    /// Number of HA1 entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The bytes of a hex string already checked to be hex of even length.
fn decode(hex: &str) -> Vec<u8> {
    hex.as_bytes()
        .chunks_exact(2)
        .map(|pair| {
            let digit = |d: u8| (d as char).to_digit(16).unwrap_or(0) as u8;
            digit(pair[0]) << 4 | digit(pair[1])
        })
        .collect()
}

impl CredentialStore for HtdigestCredentials {
    fn ha1(
        &self,
        username: &str,
        realm: &str,
        algorithm: Algorithm,
    ) -> Result<Option<Hex>, CredentialsUnavailable> {
        // Lookups borrow: the key is built only for the map's hashing.
        Ok(self
            .entries
            .get(&(username.to_owned(), realm.to_owned(), algorithm))
            .copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_htdigest_lines_with_both_algorithms() {
        let md5 = Algorithm::Md5.ha1("alice", "ringway.test", "secret");
        let sha = Algorithm::Sha256.ha1("alice", "ringway.test", "secret");
        let text = format!(
            "# users\n\nalice:ringway.test:{md5}\nalice:ringway.test:{}\n",
            sha.as_str().to_ascii_uppercase()
        );
        let store = HtdigestCredentials::parse(&text).unwrap();
        assert_eq!(store.len(), 2);
        assert_eq!(
            store.ha1("alice", "ringway.test", Algorithm::Md5),
            Ok(Some(md5))
        );
        assert_eq!(
            store.ha1("alice", "ringway.test", Algorithm::Sha256),
            Ok(Some(sha))
        );
        assert_eq!(store.ha1("alice", "other", Algorithm::Md5), Ok(None));
        assert_eq!(store.ha1("bob", "ringway.test", Algorithm::Md5), Ok(None));
    }

    #[test]
    fn bad_lines_name_their_number() {
        for (text, line) in [
            ("alice:ringway.test\n", 1),
            ("# c\nalice:r:abc\n", 2),
            ("alice:r:zz0123456789abcdef0123456789abcdef\n", 1),
            (":r:0123456789abcdef0123456789abcdef\n", 1),
            (
                "a:r:0123456789abcdef0123456789abcdef\na:r:0123456789abcdef0123456789abcdef\n",
                2,
            ),
            ("a:r:x:0123456789abcdef0123456789abcdef\n", 1),
        ] {
            let error = HtdigestCredentials::parse(text).unwrap_err();
            assert_eq!(error.line, line, "{text:?}: {error}");
        }
    }
}
