//! `schedule create|list|delete` (SPEC §15) and `label` (SPEC §16).

use anyhow::{Result, bail};
use turnstile_proto::v1 as pb;

use crate::args::ScheduleCreateArgs;
use crate::client::{Client, print_pages};

/// `--at`: Unix ms, or `+N` with a unit (ms, s, m, h, d) from now.
fn at_ms(text: &str, now_ms: u64) -> Result<u64> {
    let Some(rest) = text.strip_prefix('+') else {
        return text.parse().map_err(|_| anyhow::anyhow!("--at {text:?} is not Unix milliseconds or +DURATION (+90s)"));
    };
    let split = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let (digits, unit) = rest.split_at(split);
    let n: u64 = digits.parse().map_err(|_| anyhow::anyhow!("--at {text:?}: {digits:?} is not a number"))?;
    let unit_ms = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => bail!("--at {text:?}: unit {other:?} is not one of ms, s, m, h, d"),
    };
    Ok(now_ms + n * unit_ms)
}

fn preset(name: &str) -> Result<pb::SchedulePreset> {
    Ok(match name {
        "followup" => pb::SchedulePreset::Followup,
        "queue" => pb::SchedulePreset::Queue,
        "steer" => pb::SchedulePreset::Steer,
        "inject" => pb::SchedulePreset::Inject,
        other => bail!("--preset {other:?} is not a preset; use followup, queue, steer or inject"),
    })
}

fn schedule_line(s: &pb::Schedule) -> String {
    let session = s.session.clone().unwrap_or_default();
    let timing = if s.cron.is_empty() {
        format!("at={}", s.at_unix_ms)
    } else {
        format!("cron={:?} tz={}", s.cron, s.time_zone)
    };
    let next = s.next_fire_unix_ms.map_or("-".to_owned(), |t| t.to_string());
    let preset = pb::SchedulePreset::try_from(s.preset).map_or("?", |p| match p {
        pb::SchedulePreset::Followup => "followup",
        pb::SchedulePreset::Queue => "queue",
        pb::SchedulePreset::Steer => "steer",
        pb::SchedulePreset::Inject => "inject",
        pb::SchedulePreset::Unspecified => "?",
    });
    format!(
        "{}/{} {} {preset} {timing} next={next} fired={} missed={}",
        session.tenant, session.id, s.schedule_id, s.fired, s.missed
    )
}

pub async fn create(client: &mut Client, a: ScheduleCreateArgs) -> Result<()> {
    let timing = match (&a.at, &a.cron) {
        (Some(at), _) => pb::create_schedule_request::Timing::AtUnixMs(at_ms(at, turnstile_ops::clock::now_ms())?),
        (None, Some(cron)) => pb::create_schedule_request::Timing::Cron(cron.clone()),
        (None, None) => bail!("give --at or --cron"),
    };
    let text = a.text.join(" ");
    let request = pb::CreateScheduleRequest {
        session: Some(client.session(&a.session)),
        schedule_id: a.schedule_id,
        preset: preset(&a.preset)?.into(),
        message: Some(pb::UserMessage {
            id: String::new(),
            content: vec![pb::ContentBlock { block: Some(pb::content_block::Block::Text(pb::TextBlock { text })) }],
            source: None,
        }),
        timing: Some(timing),
        time_zone: a.time_zone.unwrap_or_default(),
        not_after_unix_ms: a.not_after,
        catchup_ms: a.catchup_ms,
    };
    let schedule = client.api.create_schedule(request).await?.into_inner();
    client.print(&schedule, &[], schedule_line)
}

pub async fn list(client: &mut Client, session: Option<&str>) -> Result<()> {
    print_pages(client, schedule_line, async |client, page_token| {
        let request = pb::ListSchedulesRequest {
            session: session.map(|s| client.session(s)),
            page_token,
            page_size: 0,
            tenant: client.tenant.clone(),
        };
        let reply = client.api.list_schedules(request).await?.into_inner();
        Ok((reply.schedules, reply.next_page_token))
    })
    .await
}

pub async fn delete(client: &mut Client, session: &str, schedule_id: &str) -> Result<()> {
    let request =
        pb::DeleteScheduleRequest { session: Some(client.session(session)), schedule_id: schedule_id.to_owned() };
    let schedule = client.api.delete_schedule(request).await?.into_inner();
    client.print(&schedule, &[], schedule_line)
}

/// `label SESSION KEY=VALUE… -KEY…`.
pub async fn label(client: &mut Client, session: &str, changes: &[String]) -> Result<()> {
    let mut request = pb::SetLabelsRequest { session: Some(client.session(session)), ..Default::default() };
    for change in changes {
        if let Some(key) = change.strip_prefix('-') {
            request.remove_keys.push(key.to_owned());
        } else if let Some((k, v)) = change.split_once('=') {
            request.labels.insert(k.to_owned(), v.to_owned());
        } else {
            bail!("{change:?} is neither KEY=VALUE (set a label) nor -KEY (remove one)");
        }
    }
    let info = client.api.set_labels(request).await?.into_inner();
    client.print(&info, &[], crate::client::info_line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_takes_unix_ms_or_a_duration_from_now() {
        assert_eq!(at_ms("1700000000000", 5).unwrap(), 1_700_000_000_000);
        assert_eq!(at_ms("+90s", 1_000).unwrap(), 91_000);
        assert_eq!(at_ms("+2m", 0).unwrap(), 120_000);
        assert!(at_ms("+3y", 0).unwrap_err().to_string().contains("unit"));
        assert!(at_ms("soon", 0).is_err());
    }
}
