-- When actors were last active, as routers and the API report it, apart
-- from the actor records: a report must not bump an actor's version (its
-- workflow steps compare-and-set on it), and a batch of them is one
-- statement. One row per actor and reporter: each router counts the
-- requests it has in flight itself.

CREATE TABLE actor_activity (
    space       {{text}} NOT NULL,
    name        {{text}} NOT NULL,
    reporter    {{text}} NOT NULL,
    last_active {{time}} NOT NULL,
    in_flight   BIGINT NOT NULL,
    report_time {{time}} NOT NULL,
    PRIMARY KEY (space, name, reporter)
);
CREATE INDEX actor_activity_report_time ON actor_activity (report_time);
