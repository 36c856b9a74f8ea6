//! What a person may do through the dashboard or the API: an [`Action`] by name,
//! and [`perform`], which runs it to its end whatever happens to the request.

use axum::http::StatusCode;

use super::App;
use crate::pool::actions::{self, ActionError, Actor, Done};

/// An action by name, on a robot or a slot.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    Pause,
    Resume,
    Restart,
    /// One extra run of a scheduled robot now.
    Trigger,
    /// A new spec (and kind), judged by the robot's holder (see
    /// [`actions::update`]).
    Update {
        kind: Option<String>,
        spec: bson::Document,
    },
    Move {
        to: String,
    },
    Delete,
    Drain,
    Undrain,
}

impl Action {
    /// A robot's action from its path segment (`move` needs a destination).
    pub(crate) fn for_robot(name: &str, to: Option<String>) -> Result<Action, String> {
        match (name, to) {
            ("pause", _) => Ok(Action::Pause),
            ("resume", _) => Ok(Action::Resume),
            ("restart", _) => Ok(Action::Restart),
            ("trigger", _) => Ok(Action::Trigger),
            ("delete", _) => Ok(Action::Delete),
            ("move", Some(to)) if !to.is_empty() => Ok(Action::Move { to }),
            ("move", _) => Err("move needs a destination slot: {\"to\": \"slot-002\"}".into()),
            _ => Err(format!(
                "no robot action {name:?}: use pause, resume, restart, trigger, move or delete"
            )),
        }
    }

    pub(crate) fn for_slot(name: &str) -> Result<Action, String> {
        match name {
            "drain" => Ok(Action::Drain),
            "undrain" => Ok(Action::Undrain),
            _ => Err(format!("no slot action {name:?}: use drain or undrain")),
        }
    }

    pub(crate) fn word(&self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Resume => "resume",
            Action::Restart => "restart",
            Action::Trigger => "trigger",
            Action::Update { .. } => "update",
            Action::Move { .. } => "move",
            Action::Delete => "delete",
            Action::Drain => "drain",
            Action::Undrain => "undrain",
        }
    }
}

/// Runs `action` on `target` (a robot's name or a slot's id).
pub(crate) async fn perform(
    app: &App,
    target: &str,
    action: &Action,
    actor: &Actor,
) -> Result<Done, ActionError> {
    let (app, target, action, actor) = (
        app.clone(),
        target.to_string(),
        action.clone(),
        actor.clone(),
    );
    super::to_the_end(async move {
        let store = &app.store;
        let done = match &action {
            Action::Pause => actions::set_paused(store, &target, true, &actor).await,
            Action::Resume => actions::set_paused(store, &target, false, &actor).await,
            Action::Restart => actions::restart(store, &target, &actor).await,
            Action::Trigger => actions::trigger(store, &target, &actor).await,
            Action::Update { kind, spec } => {
                actions::update(store, &target, kind.as_deref(), spec.clone(), false, &actor)
                    .await
                    .map(|asked| Done {
                        name: target.clone(),
                        changed: !asked.changes.is_empty(),
                        slot: Some(asked.slot),
                        repaired: false,
                    })
            }
            Action::Move { to } => actions::move_to(store, &target, to, &actor).await,
            Action::Delete => actions::delete(store, &target, &actor).await,
            Action::Drain => actions::set_draining(store, &target, true, &actor).await,
            Action::Undrain => actions::set_draining(store, &target, false, &actor).await,
        };
        app.forget(&target);
        done
    })
    .await
}

/// The status an action's failure answers with.
pub(crate) fn failure_status(e: &ActionError) -> StatusCode {
    match e {
        ActionError::NoRobot(_) | ActionError::NoSlot(_) => StatusCode::NOT_FOUND,
        ActionError::Invalid(_) => StatusCode::BAD_REQUEST,
        ActionError::Db(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::CONFLICT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_by_name() {
        assert_eq!(Action::for_robot("pause", None), Ok(Action::Pause));
        assert_eq!(
            Action::for_robot("move", Some("slot-2".into())),
            Ok(Action::Move {
                to: "slot-2".into()
            })
        );
        assert!(Action::for_robot("move", None)
            .unwrap_err()
            .contains("destination"));
        assert!(Action::for_robot("move", Some(String::new())).is_err());
        assert!(Action::for_robot("drain", None).is_err());
        assert_eq!(Action::for_slot("undrain"), Ok(Action::Undrain));
        assert!(Action::for_slot("pause")
            .unwrap_err()
            .contains("drain or undrain"));
    }
}
