//! Receipt handles. Clients must treat them as opaque; the emulator writes them in the shape of
//! the broker's POP "extraInfo" (space separated:
//! `startOffset retrieveTime invisibleTime reviveQueueId topicType brokerName queueId offset
//! [commitLogOffset]`), with emulator-clock milliseconds as times and a delivery sequence
//! number in the last, optional position. A handle with fewer than 8 fields or a non-numeric
//! field is malformed, which the proxy answers with `INTERNAL_SERVER_ERROR`.

/// A decoded receipt handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReceiptHandle {
    pub(crate) retrieve_ms: i64,
    pub(crate) invisible_ms: i64,
    pub(crate) broker_name: String,
    pub(crate) queue_id: i64,
    pub(crate) offset: i64,
    /// The delivery this handle was issued for; absent in 8-field handles.
    pub(crate) seq: Option<i64>,
}

impl ReceiptHandle {
    pub(crate) fn encode(
        retrieve_ms: u64,
        invisible_ms: u64,
        broker_name: &str,
        queue_id: usize,
        offset: u64,
        seq: u64,
    ) -> String {
        format!("{offset} {retrieve_ms} {invisible_ms} 0 0 {broker_name} {queue_id} {offset} {seq}")
    }

    /// Parses a handle; the error says what was wrong (it becomes the status message).
    pub(crate) fn decode(s: &str) -> Result<Self, String> {
        // Nine fields at most are read; a tenth and beyond are ignored, as by the proxy.
        let mut fields = [""; 9];
        let mut count = 0;
        for (slot, field) in fields.iter_mut().zip(s.split(' ')) {
            *slot = field;
            count += 1;
        }
        if count < 8 {
            return Err(format!(
                "illegal receipt handle: {count} fields, expected at least 8"
            ));
        }
        let num = |i: usize| -> Result<i64, String> {
            fields[i]
                .parse::<i64>()
                .map_err(|_| format!("illegal receipt handle: field {i} is not a number"))
        };
        // startOffset, reviveQueueId and topicType are checked for shape only.
        num(0)?;
        num(3)?;
        num(4)?;
        let seq = if count > 8 { Some(num(8)?) } else { None };
        Ok(Self {
            retrieve_ms: num(1)?,
            invisible_ms: num(2)?,
            broker_name: fields[5].to_owned(),
            queue_id: num(6)?,
            offset: num(7)?,
            seq,
        })
    }

    /// `nextVisibleTime <= now`, as the proxy's `isExpired`.
    pub(crate) fn is_expired(&self, now_ms: u64) -> bool {
        let next_visible = self.retrieve_ms.saturating_add(self.invisible_ms);
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        next_visible <= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let s = ReceiptHandle::encode(1_000, 60_000, "broker-a", 3, 42, 7);
        let h = ReceiptHandle::decode(&s).unwrap();
        assert_eq!(h.retrieve_ms, 1_000);
        assert_eq!(h.invisible_ms, 60_000);
        assert_eq!(h.broker_name, "broker-a");
        assert_eq!(h.queue_id, 3);
        assert_eq!(h.offset, 42);
        assert_eq!(h.seq, Some(7));
        assert!(!h.is_expired(60_999));
        assert!(h.is_expired(61_000));
    }

    #[test]
    fn malformed_inputs_are_errors_not_panics() {
        for bad in [
            "",
            "garbage",
            "1 2 3 4 5 b 6",
            "x 2 3 4 5 b 6 7",
            "1 2 3 4 5 b 6 7 nope",
            "1 2 3 4 5 b 6 99999999999999999999",
            "\u{1F600} \u{1F600} \u{1F600} \u{1F600} \u{1F600} \u{1F600} \u{1F600} \u{1F600}",
        ] {
            assert!(ReceiptHandle::decode(bad).is_err(), "{bad:?}");
        }
        // Eight fields are well formed (no sequence number).
        let h = ReceiptHandle::decode("1 2 3 4 5 b 6 7").unwrap();
        assert_eq!(h.seq, None);
    }

    #[test]
    fn expiry_saturates() {
        let h = ReceiptHandle::decode(&format!("0 {} {} 0 0 b 0 0 1", i64::MAX, i64::MAX)).unwrap();
        assert!(!h.is_expired(1_000_000_000));
        let h = ReceiptHandle::decode(&format!("0 {} 0 0 0 b 0 0 1", i64::MIN)).unwrap();
        assert!(h.is_expired(0));
    }
}
