//! `Authorization` / `Proxy-Authorization` Digest credentials (RFC 3261
//! 25.1 `digest-response`, RFC 7616 3.4), parsed strictly: a header our
//! realm cannot read is answered 400, never guessed at.

use std::fmt;

/// Why credentials could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CredentialsError {
    /// Not the `Digest` scheme.
    NotDigest,
    /// A parameter list that does not follow the grammar (unterminated
    /// quote, missing `=`, empty name, ...).
    Syntax,
    /// The same parameter twice.
    Duplicate(&'static str),
    /// A parameter the digest needs is missing.
    Missing(&'static str),
    /// A parameter with a value it cannot have (`nc` not 8 hex digits, a
    /// `qop` other than `auth`, an empty value, ...).
    BadValue(&'static str),
}

impl fmt::Display for CredentialsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CredentialsError::NotDigest => f.write_str("not Digest credentials"),
            CredentialsError::Syntax => f.write_str("malformed credentials"),
            CredentialsError::Duplicate(name) => write!(f, "duplicate {name}"),
            CredentialsError::Missing(name) => write!(f, "missing {name}"),
            CredentialsError::BadValue(name) => write!(f, "bad {name}"),
        }
    }
}

impl std::error::Error for CredentialsError {}

/// Digest credentials from one header value (quoted values unquoted; a
/// value with backslash escapes is kept only if it has none, which is all
/// that the fields we use may have).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials<'a> {
    /// `username`.
    pub username: &'a str,
    /// `realm`.
    pub realm: &'a str,
    /// `nonce`.
    pub nonce: &'a str,
    /// `uri` (the digest-uri).
    pub uri: &'a str,
    /// `response` (hex).
    pub response: &'a str,
    /// `algorithm` as written (absent: MD5).
    pub algorithm: Option<&'a str>,
    /// `cnonce`.
    pub cnonce: Option<&'a str>,
    /// `qop` (`auth` when present).
    pub qop: Option<&'a str>,
    /// `nc` as written (8 hex digits).
    pub nc_text: Option<&'a str>,
    /// `nc` as a number.
    pub nc: Option<u32>,
    /// `opaque`.
    pub opaque: Option<&'a str>,
}

impl<'a> Credentials<'a> {
    /// The realm of a header value without parsing the rest (to pick the
    /// header meant for us among several); `None` if it has none.
    pub fn realm_of(value: &'a str) -> Option<&'a str> {
        let rest = strip_scheme(value)?;
        AuthParams::new(rest)
            .map_while(Result::ok)
            .find(|(name, _)| name.eq_ignore_ascii_case("realm"))
            .map(|(_, value)| value)
    }

    /// Parse a header value `Digest username="...", ...`.
    pub fn parse(value: &'a str) -> Result<Credentials<'a>, CredentialsError> {
        let rest = strip_scheme(value).ok_or(CredentialsError::NotDigest)?;
        let mut fields: [Option<&'a str>; 10] = [None; 10];
        const NAMES: [&str; 10] = [
            "username",
            "realm",
            "nonce",
            "uri",
            "response",
            "algorithm",
            "cnonce",
            "qop",
            "nc",
            "opaque",
        ];
        for param in AuthParams::new(rest) {
            let (name, value) = param?;
            if let Some(i) = NAMES.iter().position(|n| n.eq_ignore_ascii_case(name)) {
                if fields[i].replace(value).is_some() {
                    return Err(CredentialsError::Duplicate(NAMES[i]));
                }
            }
        }
        let required = |i: usize| -> Result<&'a str, CredentialsError> {
            match fields[i] {
                None => Err(CredentialsError::Missing(NAMES[i])),
                Some("") => Err(CredentialsError::BadValue(NAMES[i])),
                Some(v) => Ok(v),
            }
        };
        let response = required(4)?;
        if !response.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CredentialsError::BadValue("response"));
        }
        let qop = fields[7];
        if qop.is_some_and(|q| !q.eq_ignore_ascii_case("auth")) {
            return Err(CredentialsError::BadValue("qop"));
        }
        let nc_text = fields[8];
        let nc = match nc_text {
            Some(text) if text.len() == 8 && text.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Some(u32::from_str_radix(text, 16).map_err(|_| CredentialsError::BadValue("nc"))?)
            }
            Some(_) => return Err(CredentialsError::BadValue("nc")),
            None => None,
        };
        if qop.is_some() && (fields[6].is_none_or(str::is_empty) || nc.is_none()) {
            return Err(CredentialsError::Missing(if nc.is_none() {
                "nc"
            } else {
                "cnonce"
            }));
        }
        Ok(Credentials {
            username: required(0)?,
            realm: fields[1].ok_or(CredentialsError::Missing("realm"))?,
            nonce: required(2)?,
            uri: required(3)?,
            response,
            algorithm: fields[5],
            cnonce: fields[6],
            qop,
            nc_text,
            nc,
            opaque: fields[9],
        })
    }
}

/// The text after `Digest` and whitespace, if the scheme is Digest.
fn strip_scheme(value: &str) -> Option<&str> {
    let value = value.trim_start();
    let scheme_end = value.find([' ', '\t']).unwrap_or(value.len());
    value[..scheme_end]
        .eq_ignore_ascii_case("Digest")
        .then(|| value[scheme_end..].trim_start())
}

/// Comma-separated `name=value` / `name="quoted"` pairs.
struct AuthParams<'a> {
    rest: &'a str,
    failed: bool,
}

impl<'a> AuthParams<'a> {
    fn new(rest: &'a str) -> Self {
        AuthParams {
            rest,
            failed: false,
        }
    }
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-.!%*_+`'~".contains(&b)
}

impl<'a> Iterator for AuthParams<'a> {
    type Item = Result<(&'a str, &'a str), CredentialsError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let rest = self.rest.trim_start_matches([' ', '\t', '\r', '\n']);
        if rest.is_empty() {
            return None;
        }
        let result = parse_param(rest);
        match result {
            Ok((name, value, after)) => {
                let after = after.trim_start_matches([' ', '\t', '\r', '\n']);
                self.rest = match after.strip_prefix(',') {
                    Some(next) if !next.trim().is_empty() => next,
                    Some(_) => {
                        self.failed = true;
                        return Some(Err(CredentialsError::Syntax));
                    }
                    None if after.is_empty() => "",
                    None => {
                        self.failed = true;
                        return Some(Err(CredentialsError::Syntax));
                    }
                };
                Some(Ok((name, value)))
            }
            Err(error) => {
                self.failed = true;
                Some(Err(error))
            }
        }
    }
}

/// One `name=value` at the start of `s`: name, value, what follows.
fn parse_param(s: &str) -> Result<(&str, &str, &str), CredentialsError> {
    let name_len = s.bytes().take_while(|&b| is_token_char(b)).count();
    if name_len == 0 {
        return Err(CredentialsError::Syntax);
    }
    let name = &s[..name_len];
    let after_name = s[name_len..].trim_start_matches([' ', '\t']);
    let after_eq = after_name
        .strip_prefix('=')
        .ok_or(CredentialsError::Syntax)?
        .trim_start_matches([' ', '\t']);
    if let Some(quoted) = after_eq.strip_prefix('"') {
        let bytes = quoted.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                // An escaped character: no field we read needs one.
                b'\\' => return Err(CredentialsError::BadValue("quoted-string")),
                b'"' => return Ok((name, &quoted[..i], &quoted[i + 1..])),
                b'\r' | b'\n' => return Err(CredentialsError::Syntax),
                _ => i += 1,
            }
        }
        return Err(CredentialsError::Syntax);
    }
    let value_len = after_eq.bytes().take_while(|&b| is_token_char(b)).count();
    if value_len == 0 {
        return Err(CredentialsError::Syntax);
    }
    Ok((name, &after_eq[..value_len], &after_eq[value_len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIPP: &str = r#"Digest username="u",realm="r",cnonce="6b8b4567",nc=00000001,qop=auth,uri="sip:127.0.0.1:5070",nonce="abc",response="9a610f2803021b1cd5f83e1853d31580",algorithm=MD5"#;

    #[test]
    fn parses_sipp_credentials() {
        let c = Credentials::parse(SIPP).unwrap();
        assert_eq!(c.username, "u");
        assert_eq!(c.realm, "r");
        assert_eq!(c.uri, "sip:127.0.0.1:5070");
        assert_eq!(c.nc, Some(1));
        assert_eq!(c.nc_text, Some("00000001"));
        assert_eq!(c.qop, Some("auth"));
        assert_eq!(c.algorithm, Some("MD5"));
        assert_eq!(Credentials::realm_of(SIPP), Some("r"));
    }

    #[test]
    fn rejects_malformed_credentials() {
        for (bad, error) in [
            ("Basic dXNlcjpwYXNz", CredentialsError::NotDigest),
            (r#"Digest username="u, realm="r""#, CredentialsError::Syntax),
            (
                r#"Digest username="u",, realm="r""#,
                CredentialsError::Syntax,
            ),
            (r#"Digest username="u" realm="r""#, CredentialsError::Syntax),
            (r#"Digest ="u""#, CredentialsError::Syntax),
            (r#"Digest username"#, CredentialsError::Syntax),
            (
                r#"Digest username="u",username="v",realm="r",nonce="n",uri="sip:x",response="00""#,
                CredentialsError::Duplicate("username"),
            ),
            (
                r#"Digest username="u",realm="r",nonce="n",uri="sip:x""#,
                CredentialsError::Missing("response"),
            ),
            (
                r#"Digest username="u",realm="r",nonce="n",uri="sip:x",response="zz""#,
                CredentialsError::BadValue("response"),
            ),
            (
                r#"Digest username="u",realm="r",nonce="n",uri="sip:x",response="00",qop=auth,nc=1,cnonce="c""#,
                CredentialsError::BadValue("nc"),
            ),
            (
                r#"Digest username="u",realm="r",nonce="n",uri="sip:x",response="00",qop=auth-int,nc=00000001,cnonce="c""#,
                CredentialsError::BadValue("qop"),
            ),
            (
                r#"Digest username="u",realm="r",nonce="n",uri="sip:x",response="00",qop=auth,nc=00000001"#,
                CredentialsError::Missing("cnonce"),
            ),
            (
                r#"Digest username="",realm="r",nonce="n",uri="sip:x",response="00""#,
                CredentialsError::BadValue("username"),
            ),
        ] {
            assert_eq!(Credentials::parse(bad), Err(error), "{bad}");
        }
    }
}
