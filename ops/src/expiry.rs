//! When a certificate stops being valid: the `notAfter` of its X.509 `validity`, read from the DER with
//! the few steps of ASN.1 that reach it (RFC 5280 §4.1: Certificate → tbsCertificate → [0] version,
//! serialNumber, signature, issuer, validity), rather than a full X.509 parser for one field.

/// Seconds since the Unix epoch at which `der` (one certificate) expires; `None` if it is not a
/// certificate this reader understands.
pub(crate) fn not_after(der: &[u8]) -> Option<i64> {
    let (certificate, _) = element(der, SEQUENCE)?;
    let (mut tbs, _) = element(certificate, SEQUENCE)?;
    // The version is optional, explicitly tagged [0].
    if tbs.first() == Some(&0xa0) {
        tbs = element(tbs, 0xa0)?.1;
    }
    let (_, rest) = element(tbs, INTEGER)?; // serialNumber
    let (_, rest) = element(rest, SEQUENCE)?; // signature algorithm
    let (_, rest) = element(rest, SEQUENCE)?; // issuer
    let (validity, _) = element(rest, SEQUENCE)?;
    let (_, rest) = time(validity)?; // notBefore
    Some(time(rest)?.0)
}

/// The certificate's serial number in hex (`openssl x509 -serial` prints the same digits), for the log line
/// of a reload; `None` if `der` is not a certificate this reader understands.
pub(crate) fn serial(der: &[u8]) -> Option<String> {
    let (certificate, _) = element(der, SEQUENCE)?;
    let (mut tbs, _) = element(certificate, SEQUENCE)?;
    if tbs.first() == Some(&0xa0) {
        tbs = element(tbs, 0xa0)?.1;
    }
    let (serial, _) = element(tbs, INTEGER)?;
    Some(serial.iter().map(|b| format!("{b:02X}")).collect())
}

const INTEGER: u8 = 0x02;
const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;

/// The contents of the DER element at the start of `input` if its tag is `tag`, and what follows it.
fn element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = input.split_first()?;
    if first != tag {
        return None;
    }
    let (&len, mut rest) = rest.split_first()?;
    let len = if len < 0x80 {
        usize::from(len)
    } else {
        // Long form: the low bits count the length's bytes (at most 4: a certificate is not 4 GiB).
        let count = usize::from(len & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// A `Time` (UTCTime `YYMMDDHHMMSSZ`, years 1950–2049, or GeneralizedTime `YYYYMMDDHHMMSSZ`) as Unix
/// seconds, and what follows it.
fn time(input: &[u8]) -> Option<(i64, &[u8])> {
    let (text, year, rest) = match *input.first()? {
        UTC_TIME => {
            let (text, rest) = element(input, UTC_TIME)?;
            let yy = digits(text.get(..2)?)?;
            (text.get(2..)?, if yy < 50 { 2000 + yy } else { 1900 + yy }, rest)
        }
        GENERALIZED_TIME => {
            let (text, rest) = element(input, GENERALIZED_TIME)?;
            (text.get(4..)?, digits(text.get(..4)?)?, rest)
        }
        _ => return None,
    };
    if text.len() != 11 || text[10] != b'Z' {
        return None;
    }
    let [month, day, hour, minute, second] = [0, 2, 4, 6, 8].map(|i| digits(&text[i..i + 2]));
    let days = days_from_civil(year, month?, day?)?;
    Some((days * 86_400 + hour? * 3_600 + minute? * 60 + second?, rest))
}

fn digits(text: &[u8]) -> Option<i64> {
    text.iter().try_fold(0i64, |n, b| b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0')))
}

/// Days from 1970-01-01 to the proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> Option<i64> {
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn calendar_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), Some(0));
        assert_eq!(days_from_civil(2000, 3, 1), Some(11_017));
        assert_eq!(days_from_civil(2026, 12, 6), Some(20_793));
        assert_eq!(days_from_civil(2026, 13, 1), None);
    }

    #[test]
    fn both_time_forms_are_read() {
        // UTCTime 2049-12-31 23:59:59 and GeneralizedTime 2050-01-01 00:00:00 (RFC 5280's switch-over).
        let utc = [&[UTC_TIME, 13][..], b"491231235959Z"].concat();
        let generalized = [&[GENERALIZED_TIME, 15][..], b"20500101000000Z"].concat();
        assert_eq!(time(&utc).unwrap().0, 2_524_607_999);
        assert_eq!(time(&generalized).unwrap().0, 2_524_608_000);
        assert_eq!(time(&[UTC_TIME, 3, b'4', b'9', b'1']), None);
    }

    /// `openssl x509 -serial -noout -in deploy/k8s/overlays/dev/dev-cluster-tls/worker.crt`.
    #[test]
    fn the_serial_of_a_real_certificate_is_read() {
        let pem = include_bytes!("../../deploy/k8s/overlays/dev/dev-cluster-tls/worker.crt");
        let der = rustls_pki_types::pem::PemObject::pem_slice_iter(pem)
            .next()
            .map(|c: Result<rustls_pki_types::CertificateDer<'_>, _>| c.unwrap())
            .unwrap();
        assert_eq!(serial(&der).as_deref(), Some("6B815400BADFC4E929CCFF4E796907022F3FF218"));
        assert_eq!(serial(&[]), None);
    }

    #[test]
    fn what_is_not_a_certificate_has_no_expiry() {
        assert_eq!(not_after(&[]), None);
        assert_eq!(not_after(&[SEQUENCE, 0x82, 0xff]), None);
        assert_eq!(not_after(b"-----BEGIN CERTIFICATE-----"), None);
    }
}
