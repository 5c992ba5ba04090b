//! Mapping a response that carries ids back onto the items of a batch.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use crate::ItemReply;

/// The replies of a response matched to a batch's items by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matched<Id, R> {
    /// One entry per submitted item, in the batch's order: the response entry for that item,
    /// or `None` if the response had none (missing).
    pub replies: Vec<Option<R>>,
    /// Response entries whose id matched no item (or more entries than items with that id),
    /// in the order they came.
    pub extras: Vec<(Id, R)>,
}

impl<Id, R> Matched<Id, R> {
    /// Matches `responses` to the items whose ids are `ids` (in the batch's order).
    ///
    /// Responses may come in any order. When several items share an id, the responses with
    /// that id are given to them in submission order.
    ///
    /// ```
    /// use ack_batcher::Matched;
    /// let m = Matched::by_id(["a", "b", "a", "c"], [("c", 3), ("a", 1), ("a", 2), ("z", 9)]);
    /// assert_eq!(m.replies, [Some(1), None, Some(2), Some(3)]);
    /// assert_eq!(m.extras, [("z", 9)]);
    /// ```
    pub fn by_id(
        ids: impl IntoIterator<Item = Id>,
        responses: impl IntoIterator<Item = (Id, R)>,
    ) -> Self
    where
        Id: Hash + Eq,
    {
        let mut waiting: HashMap<Id, VecDeque<usize>> = HashMap::new();
        let mut len = 0;
        for (index, id) in ids.into_iter().enumerate() {
            waiting.entry(id).or_default().push_back(index);
            len = index + 1;
        }
        let mut replies: Vec<Option<R>> = std::iter::repeat_with(|| None).take(len).collect();
        let mut extras = Vec::new();
        for (id, reply) in responses {
            match waiting.get_mut(&id).and_then(VecDeque::pop_front) {
                Some(index) => replies[index] = Some(reply),
                None => extras.push((id, reply)),
            }
        }
        Self { replies, extras }
    }

    /// Turns the matched entries into the batcher's per-item replies: `convert` decides
    /// success or failure of each entry, and items without an entry become
    /// [`ItemReply::Missing`].
    pub fn into_replies<O, E>(
        self,
        mut convert: impl FnMut(R) -> Result<O, E>,
    ) -> Vec<ItemReply<O, E>> {
        self.replies
            .into_iter()
            .map(|reply| match reply.map(&mut convert) {
                Some(Ok(output)) => ItemReply::Ok(output),
                Some(Err(error)) => ItemReply::Err(error),
                None => ItemReply::Missing,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_duplicates_and_missing() {
        let m = Matched::by_id([7, 8, 7, 9], [(7, 'x'), (9, 'z'), (7, 'y'), (7, 'w')]);
        assert_eq!(m.replies, [Some('x'), None, Some('y'), Some('z')]);
        assert_eq!(m.extras, [(7, 'w')]);
        let replies = m.into_replies(|c| if c == 'y' { Err("bad") } else { Ok(c) });
        assert_eq!(
            replies,
            [
                ItemReply::Ok('x'),
                ItemReply::Missing,
                ItemReply::Err("bad"),
                ItemReply::Ok('z')
            ]
        );
    }

    #[test]
    fn empty_batch_reports_everything_as_extra() {
        let m = Matched::<u8, u8>::by_id([], [(1, 1)]);
        assert!(m.replies.is_empty());
        assert_eq!(m.extras, [(1, 1)]);
    }
}
