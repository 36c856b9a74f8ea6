//! The OpenAPI 3.1 document of `/api/v1`, generated from the handlers' annotations
//! and the typed answers and request bodies ([`super::answers`], [`super::api`]):
//! served at `/api/v1/openapi.json` and checked into `docs/openapi.json`, which a
//! test keeps equal to it.
//!
//! What the annotations cannot say is added here, for every operation alike: the
//! answers the layers in front of the handlers give (a foreign `Host` header, the
//! token refused, a body too large or too slow), and the links from a create's answer
//! to the created robot's operations, which lets a client, or a fuzzer, follow one
//! request with the next.

use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr};
use utoipa::{Modify, OpenApi};

use super::answers::{
    ActionAnswer, CreateAnswer, CreatedAnswer, ErrorAnswer, EventsAnswer, MoveAnswer, OutputAnswer,
    OverviewAnswer, RebalanceAnswer, RobotAnswer, RobotDetailAnswer, RobotsAnswer, SlotsAnswer,
    WorkersAnswer,
};
use super::api::{
    CreateBody, MoveBody, RebalanceBody, RobotAction, SlotAction, UpdateAnswerBody, UpdateBody,
};
use super::query::{
    OnlyParam, OrderParam, PageParam, PerPageParam, SortParam, StateParam, TextParam,
};
use super::snapshot::{EventInfo, RobotRow, SlotInfo, Summary, WorkerInfo};

/// Where the document is served.
pub(crate) const PATH: &str = "/api/v1/openapi.json";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "slotpool dashboard API",
        description = "The pool's state as `slotpool web` reads it, and the actions its token allows. Reading answers carry `now_ms` (the server's clock when the snapshot was read), `age_ms` and `error` (the last refresh's failure, else null). Every error is `{\"error\": \"...\"}`. See docs/http.md.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        super::api::overview,
        super::api::slots,
        super::api::workers,
        super::api::events,
        super::api::robots,
        super::api::robot,
        super::api::output,
        super::api::create_robots,
        super::api::update_robot,
        super::api::delete_robot,
        super::api::robot_action,
        super::api::slot_action,
        super::api::rebalance,
        served,
    ),
    components(schemas(
        ErrorAnswer, OverviewAnswer, SlotsAnswer, WorkersAnswer, EventsAnswer, RobotsAnswer,
        RobotAnswer, RobotDetailAnswer, OutputAnswer, ActionAnswer, CreateAnswer, CreatedAnswer,
        MoveAnswer, RebalanceAnswer, UpdateAnswerBody, Summary, SlotInfo, WorkerInfo, EventInfo,
        RobotRow, CreateBody, UpdateBody, MoveBody, RebalanceBody, RobotAction, SlotAction,
        TextParam, StateParam, OnlyParam, SortParam, OrderParam, PageParam, PerPageParam,
    )),
    modifiers(&Layers, &Links),
    tags(
        (name = "pool", description = "slots, workers and events, as the dashboard reads them"),
        (name = "robots", description = "robots, their state and output"),
        (name = "actions", description = "changes, for holders of the token (`slotpool web --allow-actions`)"),
        (name = "meta", description = "this document"),
    ),
)]
struct ApiDoc;

/// This document.
#[utoipa::path(get, path = "/api/v1/openapi.json", operation_id = "get_openapi", tag = "meta",
    responses(
        (status = 200, description = "the OpenAPI 3.1 document of /api/v1", content_type = "application/json", body = Object),
        (status = 421, description = "the `Host` header names another site", body = ErrorAnswer),
    ))]
pub(crate) async fn served() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        text(),
    )
        .into_response()
}

/// The document.
pub(crate) fn document() -> Document {
    ApiDoc::openapi()
}

/// The document as served and as checked into docs/openapi.json: pretty JSON and a
/// final newline. Made once.
pub fn text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let mut t = document()
            .to_pretty_json()
            .expect("the document serializes");
        t.push('\n');
        t
    })
}

/// The answers of the layers in front of every handler, and the token.
struct Layers;

impl Modify for Layers {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The dashboard's token (SLOTPOOL_WEB_TOKEN), given to actions only",
                    ))
                    .build(),
            ),
        );
        for item in doc.paths.paths.values_mut() {
            let ops = [
                (&mut item.get, false),
                (&mut item.put, true),
                (&mut item.post, true),
                (&mut item.delete, true),
            ];
            for (op, writes) in ops {
                if let Some(op) = op.as_mut() {
                    add_layer_answers(op, writes);
                }
            }
        }
    }
}

/// `{"error": …}` with `description`.
fn error_answer(description: &str) -> RefOr<utoipa::openapi::Response> {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorAnswer")))
                .build(),
        )
        .into()
}

fn add_layer_answers(op: &mut Operation, writes: bool) {
    let mut add = |status: &str, description: &str| {
        op.responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| error_answer(description));
    };
    add("421", "the `Host` header names another site");
    if writes {
        add("400", "a body that is not the JSON this operation takes");
        add(
            "401",
            "no token, or a wrong one (`WWW-Authenticate: Bearer`)",
        );
        add("403", "actions are disabled: the dashboard is read-only");
        add("408", "the body did not arrive within 5 s");
        add("413", "a body over 16 KiB");
        add(
            "429",
            "too many wrong tokens from this address: wait and retry",
        );
        add(
            "503",
            "the database did not answer, or too many bodies are arriving at once (see Retry-After)",
        );
    }
}

/// A create's answer names the robots it created: links to what can be done to the
/// first one.
struct Links;

impl Modify for Links {
    fn modify(&self, doc: &mut Document) {
        let Some(item) = doc.paths.paths.get_mut("/api/v1/robots") else {
            return;
        };
        let Some(create) = item.post.as_mut() else {
            return;
        };
        let Some(RefOr::T(created)) = create.responses.responses.get_mut("201") else {
            return;
        };
        for (name, op, description) in [
            ("GetCreatedRobot", "get_robot", "the robot just created"),
            ("GetCreatedRobotOutput", "get_robot_output", "its output"),
            ("UpdateCreatedRobot", "update_robot", "change it"),
            (
                "ActOnCreatedRobot",
                "robot_action",
                "pause, resume, restart, trigger or move it",
            ),
            ("DeleteCreatedRobot", "delete_robot", "delete it"),
        ] {
            let link = LinkBuilder::new()
                .operation_id(op)
                .parameter("name", "$response.body#/created/0/name")
                .description(description)
                .build();
            created.links.insert(name.to_string(), link.into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_is_openapi_3_1_and_names_every_route_of_the_api() {
        let doc: serde_json::Value = serde_json::from_str(text()).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        let paths = doc["paths"].as_object().unwrap();
        for p in [
            "/api/v1/overview",
            "/api/v1/slots",
            "/api/v1/workers",
            "/api/v1/events",
            "/api/v1/robots",
            "/api/v1/robots/{name}",
            "/api/v1/robots/{name}/output",
            "/api/v1/robots/{name}/{action}",
            "/api/v1/slots/{id}/{action}",
            "/api/v1/rebalance",
            PATH,
        ] {
            assert!(paths.contains_key(p), "{p} is not documented");
        }
        // Every write names the token and every refusal the layers give.
        let create = &paths["/api/v1/robots"]["post"];
        assert_eq!(create["security"][0]["token"], serde_json::json!([]));
        for status in ["401", "403", "413", "421", "429"] {
            assert!(create["responses"].get(status).is_some(), "{status}");
        }
        assert_eq!(
            create["responses"]["201"]["links"]["GetCreatedRobot"]["operationId"],
            "get_robot"
        );
        // Reads take no token.
        assert!(paths["/api/v1/slots"]["get"].get("security").is_none());
    }

    #[test]
    fn every_reference_resolves_and_the_limits_are_the_codes() {
        let doc: serde_json::Value = serde_json::from_str(text()).unwrap();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        let mut rest = text();
        while let Some(i) = rest.find("#/components/schemas/") {
            let tail = &rest[i + "#/components/schemas/".len()..];
            let name = &tail[..tail.find('"').unwrap()];
            assert!(
                schemas.contains_key(name),
                "{name} is referred to, not defined"
            );
            rest = tail;
        }
        let count = &schemas["CreateBody"]["properties"]["count"];
        assert_eq!(count["maximum"], crate::pool::create::MAX_COUNT);
        let per_page = doc["paths"]["/api/v1/robots"]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "per_page")
            .unwrap();
        assert_eq!(
            schemas["PerPageParam"]["anyOf"][0]["maximum"],
            super::super::query::MAX_PER_PAGE
        );
        assert_eq!(
            per_page["schema"]["$ref"],
            "#/components/schemas/PerPageParam"
        );
    }

    #[test]
    fn the_action_words_documented_are_the_ones_taken() {
        let doc: serde_json::Value = serde_json::from_str(text()).unwrap();
        let words = |schema: &str| -> Vec<String> {
            doc["components"]["schemas"][schema]["enum"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap().to_string())
                .collect()
        };
        for w in words("RobotAction") {
            let to = (w == "move").then(|| "slot-002".to_string());
            assert!(
                super::super::action::Action::for_robot(&w, to).is_ok(),
                "{w}"
            );
        }
        for w in words("SlotAction") {
            assert!(super::super::action::Action::for_slot(&w).is_ok(), "{w}");
        }
    }
}
