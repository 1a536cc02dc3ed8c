//! Reading a whole list page by page for the final check. A check of part of the state would
//! pass on what it could not see, so a list that does not end within the page budget is an
//! error, never a shorter list.

use std::future::Future;

/// Calls `read` with the position after the previous page (`None` first) until a page comes
/// back without a next position; at most `max_pages` pages.
pub async fn read_all_pages<T, P, F, Fut>(
    what: &str,
    max_pages: usize,
    mut read: F,
) -> anyhow::Result<Vec<T>>
where
    F: FnMut(Option<P>) -> Fut,
    Fut: Future<Output = anyhow::Result<(Vec<T>, Option<P>)>>,
{
    let mut rows = Vec::new();
    let mut after = None;
    for _ in 0..max_pages {
        let (page, next) = read(after.take()).await?;
        rows.extend(page);
        match next {
            Some(next) => after = Some(next),
            None => return Ok(rows),
        }
    }
    anyhow::bail!(
        "{what}: more than {max_pages} pages ({} rows read); the final check cannot read them \
         all (shorten the run or raise the page budget)",
        rows.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list of `len` numbers served `page` at a time, the position being the last number.
    async fn serve(
        len: u32,
        page: u32,
        after: Option<u32>,
    ) -> anyhow::Result<(Vec<u32>, Option<u32>)> {
        let start = after.map_or(0, |last| last + 1);
        let rows: Vec<u32> = (start..len).take(page as usize).collect();
        let next = (rows.len() == page as usize).then(|| *rows.last().expect("a full page"));
        Ok((rows, next))
    }

    #[tokio::test]
    async fn every_row_once_across_pages() {
        for (len, page) in [(0, 3), (1, 3), (3, 3), (7, 3), (9, 3)] {
            let rows = read_all_pages("numbers", 10, |after| serve(len, page, after))
                .await
                .expect("fits the page budget");
            assert_eq!(
                rows,
                (0..len).collect::<Vec<_>>(),
                "{len} rows, {page} a page"
            );
        }
    }

    #[tokio::test]
    async fn a_list_longer_than_the_budget_is_an_error_not_a_shorter_list() {
        let error = read_all_pages("live holds of fam-1", 3, |after| serve(10, 3, after))
            .await
            .expect_err("three pages of three cannot hold ten rows");
        assert!(
            error
                .to_string()
                .contains("live holds of fam-1: more than 3 pages (9 rows read)"),
            "{error}"
        );
        // Exactly filling the budget with a last, short page is fine.
        let rows = read_all_pages("n", 4, |after| serve(10, 3, after))
            .await
            .expect("fits");
        assert_eq!(rows.len(), 10);
    }

    #[tokio::test]
    async fn a_failed_page_fails_the_read() {
        let mut calls = 0;
        let error = read_all_pages("n", 10, |after: Option<u32>| {
            calls += 1;
            let fail = calls == 2;
            async move {
                if fail {
                    anyhow::bail!("node unreachable");
                }
                serve(10, 3, after).await
            }
        })
        .await
        .expect_err("the second page failed");
        assert_eq!(error.to_string(), "node unreachable");
    }
}
