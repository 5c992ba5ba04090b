//! Header checks the proxy makes before any RPC: the signature (when credentials are
//! configured) and the client id.

use std::collections::HashMap;

use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use tonic::metadata::MetadataMap;

pub(crate) const CLIENT_ID: &str = "x-mq-client-id";
pub(crate) const DATE_TIME: &str = "x-mq-date-time";
pub(crate) const AUTHORIZATION: &str = "authorization";
pub(crate) const CLIENT_VERSION: &str = "x-mq-client-version";

/// A header as a string; `None` when absent or not visible ASCII.
pub(crate) fn header<'a>(md: &'a MetadataMap, name: &str) -> Option<&'a str> {
    md.get(name).and_then(|v| v.to_str().ok())
}

/// The client id, or `None` when missing or blank (`CLIENT_ID_REQUIRED`).
pub(crate) fn client_id(md: &MetadataMap) -> Option<String> {
    let id = header(md, CLIENT_ID)?.trim();
    (!id.is_empty()).then(|| id.to_owned())
}

/// The gRPC deadline the client set (`grpc-timeout`: up to 8 digits and a unit), in
/// milliseconds.
pub(crate) fn grpc_timeout_ms(md: &MetadataMap) -> Option<u64> {
    let v = header(md, "grpc-timeout")?;
    if v.len() < 2 || v.len() > 9 || !v.is_char_boundary(v.len() - 1) {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => n.saturating_mul(3_600_000),
        "M" => n.saturating_mul(60_000),
        "S" => n.saturating_mul(1000),
        "m" => n,
        "u" => n / 1000,
        "n" => n / 1_000_000,
        _ => return None,
    })
}

/// Verifies `authorization` against the configured access keys (§3.3 of the reference):
/// split on the first space, then on `,` into `k=v` pairs; `Credential` split on `/`, element 0
/// is the access key; `Signature` is hex (either case) of HMAC-SHA1(secret, raw
/// `x-mq-date-time`), compared in constant time. No freshness check, as the proxy.
///
/// With no credentials configured every request passes. With credentials, an absent header is
/// rejected (the emulator has no anonymous access).
pub(crate) fn verify(
    md: &MetadataMap,
    credentials: &HashMap<String, String>,
) -> Result<(), String> {
    if credentials.is_empty() {
        return Ok(());
    }
    let Some(auth) = header(md, AUTHORIZATION) else {
        return Err("authorization header is missing".to_owned());
    };
    let date_time = header(md, DATE_TIME).unwrap_or("");
    if date_time.is_empty() {
        return Err("x-mq-date-time header is required with authorization".to_owned());
    }
    let (_algorithm, rest) = auth
        .split_once(' ')
        .ok_or_else(|| "malformed authorization header".to_owned())?;
    let mut credential = None;
    let mut signature = None;
    for pair in rest.split(',') {
        let pair = pair.trim();
        if let Some((k, v)) = pair.split_once('=') {
            match k.trim() {
                "Credential" => credential = Some(v.trim()),
                "Signature" => signature = Some(v.trim()),
                _ => {}
            }
        }
    }
    let credential = credential.ok_or_else(|| "authorization has no Credential".to_owned())?;
    let signature = signature.ok_or_else(|| "authorization has no Signature".to_owned())?;
    let access_key = credential.split('/').next().unwrap_or("");
    let secret = credentials
        .get(access_key)
        .ok_or_else(|| format!("unknown access key {access_key:?}"))?;
    let signature =
        hex::decode(signature).map_err(|_| "signature is not hexadecimal".to_owned())?;
    let mut mac = Hmac::<Sha1>::new_from_slice(secret.as_bytes())
        .map_err(|_| "invalid secret key".to_owned())?;
    mac.update(date_time.as_bytes());
    mac.verify_slice(&signature)
        .map_err(|_| "signature does not match".to_owned())
}

/// The hex signature a client sends (test helper).
#[cfg(test)]
pub(crate) fn sign(secret: &str, date_time: &str) -> String {
    let mut mac = Hmac::<Sha1>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(date_time.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: &[(&'static str, &str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    fn creds() -> HashMap<String, String> {
        HashMap::from([("ak".to_owned(), "sk".to_owned())])
    }

    #[test]
    fn no_credentials_means_no_check() {
        assert!(verify(&md(&[]), &HashMap::new()).is_ok());
    }

    #[test]
    fn accepts_java_go_and_rust_styles() {
        let dt = "20260101T000000Z";
        let sig = sign("sk", dt);
        for cred in ["ak", "ak//Rocketmq"] {
            for s in [sig.clone(), sig.to_uppercase()] {
                let auth = format!(
                    "MQv2-HMAC-SHA1 Credential={cred}, SignedHeaders=x-mq-date-time, Signature={s}"
                );
                let m = md(&[("authorization", &auth), ("x-mq-date-time", dt)]);
                assert_eq!(verify(&m, &creds()), Ok(()), "{auth}");
            }
        }
    }

    #[test]
    fn rejects_missing_wrong_and_garbage() {
        let dt = "2026-01-01T00:00:00+08:00";
        let good = format!("MQv2-HMAC-SHA1 Credential=ak, Signature={}", sign("sk", dt));
        let cases: Vec<Vec<(&'static str, String)>> = vec![
            vec![],
            vec![("authorization", good.clone())],
            vec![
                ("authorization", good.clone()),
                ("x-mq-date-time", "other".into()),
            ],
            vec![
                ("authorization", "garbage".into()),
                ("x-mq-date-time", dt.into()),
            ],
            vec![
                ("authorization", "MQv2-HMAC-SHA1 Credential=ak".into()),
                ("x-mq-date-time", dt.into()),
            ],
            vec![
                (
                    "authorization",
                    "MQv2-HMAC-SHA1 Credential=zz, Signature=00".into(),
                ),
                ("x-mq-date-time", dt.into()),
            ],
            vec![
                (
                    "authorization",
                    "MQv2-HMAC-SHA1 Credential=ak, Signature=xyz".into(),
                ),
                ("x-mq-date-time", dt.into()),
            ],
        ];
        for case in cases {
            let pairs: Vec<(&'static str, &str)> =
                case.iter().map(|(k, v)| (*k, v.as_str())).collect();
            assert!(verify(&md(&pairs), &creds()).is_err(), "{case:?}");
        }
        let ok = md(&[("authorization", &good), ("x-mq-date-time", dt)]);
        assert!(verify(&ok, &creds()).is_ok());
    }

    #[test]
    fn grpc_timeout_units() {
        let t = |v: &str| grpc_timeout_ms(&md(&[("grpc-timeout", v)]));
        assert_eq!(t("2999m"), Some(2999));
        assert_eq!(t("3S"), Some(3000));
        assert_eq!(t("1M"), Some(60_000));
        assert_eq!(t("1H"), Some(3_600_000));
        assert_eq!(t("5000u"), Some(5));
        assert_eq!(t("9000000n"), Some(9));
        for bad in ["", "m", "12x", "-1S", "123456789S", "1.5S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout_ms(&md(&[])), None);
    }

    #[test]
    fn client_id_must_be_non_blank() {
        assert_eq!(client_id(&md(&[])), None);
        assert_eq!(client_id(&md(&[("x-mq-client-id", "  ")])), None);
        assert_eq!(
            client_id(&md(&[("x-mq-client-id", "c1")])),
            Some("c1".into())
        );
    }
}
