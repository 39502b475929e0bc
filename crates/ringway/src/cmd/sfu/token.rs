//! `ringway sfu token`: mint a signed join token (JWT, HMAC-SHA256) with
//! the key file `sfu serve --token-key-file` reads.

use anyhow::Context;
use ringway_sfu::token::{mint, Claims, TokenKey};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// `ringway sfu token` options.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct TokenArgs {
    /// The key file (the same as `sfu serve --token-key-file`).
    #[arg(long, value_hint = clap::ValueHint::FilePath)]
    pub key_file: PathBuf,
    /// Room the token admits to.
    #[arg(long)]
    pub room: String,
    /// The participant's identity (shown in the admin API).
    #[arg(long)]
    pub identity: String,
    /// Seconds until it expires.
    #[arg(long, default_value_t = 3600)]
    pub ttl: u64,
    /// Seconds before it becomes valid (0: at once).
    #[arg(long, default_value_t = 0)]
    pub not_before: u64,
    /// The holder may not send media (listen only).
    #[arg(long)]
    pub no_publish: bool,
    /// The holder may not subscribe (send only).
    #[arg(long)]
    pub no_subscribe: bool,
}

/// Print a token for the options.
pub(crate) fn run(a: TokenArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&a.key_file)
        .with_context(|| format!("reading the key file {}", a.key_file.display()))?;
    let key = TokenKey::from_file_contents(bytes)
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.key_file.display()))?;
    anyhow::ensure!(
        !a.room.is_empty()
            && a.room.len() <= 64
            && a.identity.len() <= 64
            && !a.identity.is_empty(),
        "room and identity must be 1-64 bytes"
    );
    anyhow::ensure!(a.ttl > 0, "--ttl must be positive");
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let claims = Claims {
        room: a.room,
        sub: a.identity,
        exp: now + a.not_before + a.ttl,
        nbf: (a.not_before > 0).then_some(now + a.not_before),
        iat: Some(now),
        publish: !a.no_publish,
        subscribe: !a.no_subscribe,
    };
    println!("{}", mint(&key, &claims));
    Ok(())
}
