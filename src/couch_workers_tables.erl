%% @doc The ETS tables that outlive a crash of the server that writes them.
%%
%% `couch_workers_sup:init/1' creates them, so the supervisor owns them
%% and they last as long as the application: a server that crashes and is
%% restarted finds its registrations and subscriptions where it left them
%% and restores them (monitors, watchers, callback processes), instead of
%% dropping them silently. Each table is written by one server only (they
%% are `public' because the supervisor, their owner, writes none of them).
%%
%% | table                          | written by              | rows                                       |
%% | ------------------------------ | ----------------------- | ------------------------------------------ |
%% | `couch_workers_local'          | `couch_workers_local'   | `{{Type, Id}, Ref}', `{Ref, Type, Id, Pid, Registration, MonRef}' |
%% | `couch_workers_membership'     | `couch_workers_global'  | `{Type, VS, Workers}': the cached membership |
%% | `couch_workers_membership_subs'| `couch_workers_global' (and its callback processes: the last VS they took) | `{Ref, Type, Pid, Module, SeenVS}' |
%% | `couch_workers_jobs_subs'      | `couch_workers_jobs_subs' | `{SubRef, Pid, Handle}': a job subscription and its NIF handle (the row keeps the handle alive) |
%% | `couch_workers_node_marks'     | the servers of the two tables above (`couch_workers_node:claim/1') | `{Table, Owner}': the node owner under which `Table''s handles were taken |
-module(couch_workers_tables).

-export([create/0]).

-spec create() -> ok.
create() ->
    Read = [named_table, public, set, {read_concurrency, true}],
    couch_workers_local = ets:new(couch_workers_local, Read),
    couch_workers_membership = ets:new(couch_workers_membership, Read),
    couch_workers_membership_subs = ets:new(couch_workers_membership_subs, [named_table, public, set]),
    couch_workers_jobs_subs = ets:new(couch_workers_jobs_subs, [named_table, public, set]),
    couch_workers_node_marks = ets:new(couch_workers_node_marks, [named_table, public, set]),
    ok.
