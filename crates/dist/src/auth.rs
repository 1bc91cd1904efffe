//! Challenge-response with a shared secret (`--dist-token`): HMAC-SHA256 over both nonces and the
//! direction, so the secret never crosses the wire and a proof cannot be replayed or reflected.
use crate::error::{DistError, Result};
use crate::protocol::{Digest32, Nonce};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

pub fn nonce() -> Result<Nonce> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| DistError::Auth(format!("no randomness for a nonce: {e}")))?;
    Ok(n)
}

fn mac(secret: &str, label: &[u8], a: &Nonce, b: &Nonce) -> HmacSha256 {
    // HMAC accepts keys of any length.
    let mut m = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    m.update(b"ds4-dist-v1 ");
    m.update(label);
    m.update(a);
    m.update(b);
    m
}

/// The worker's proof: over the coordinator's challenge, then its own nonce.
pub fn worker_proof(secret: &str, coord_nonce: &Nonce, worker_nonce: &Nonce) -> Digest32 {
    mac(secret, b"worker", coord_nonce, worker_nonce).finalize().into_bytes().into()
}

/// The coordinator's proof: over the worker's nonce, then its own.
pub fn coordinator_proof(secret: &str, worker_nonce: &Nonce, coord_nonce: &Nonce) -> Digest32 {
    mac(secret, b"coordinator", worker_nonce, coord_nonce).finalize().into_bytes().into()
}

/// Constant-time check of a proof.
pub fn verify_worker(secret: &str, coord_nonce: &Nonce, worker_nonce: &Nonce, proof: &Digest32) -> bool {
    mac(secret, b"worker", coord_nonce, worker_nonce).verify_slice(proof).is_ok()
}

pub fn verify_coordinator(secret: &str, worker_nonce: &Nonce, coord_nonce: &Nonce, proof: &Digest32) -> bool {
    mac(secret, b"coordinator", worker_nonce, coord_nonce).verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_secret_nonces_and_direction() {
        let (c, w) = (nonce().unwrap(), nonce().unwrap());
        assert_ne!(c, w);
        let p = worker_proof("s3cret", &c, &w);
        assert!(verify_worker("s3cret", &c, &w, &p));
        assert!(!verify_worker("other", &c, &w, &p));
        assert!(!verify_worker("s3cret", &w, &c, &p));
        // A worker proof is not a coordinator proof (no reflection).
        assert!(!verify_coordinator("s3cret", &c, &w, &p));
        let q = coordinator_proof("s3cret", &w, &c);
        assert!(verify_coordinator("s3cret", &w, &c, &q));
    }
}
