%% @doc Telemetry events, through the stand-in `telemetry' module of
%% test/ (the real application cannot be installed here): while it is
%% loaded, every counted event reaches it with its measurements and
%% metadata; while it is not, none does and the counters still count.
-module(couch_workers_telemetry_tests).

-include("couch_workers_test.hrl").

-import(couch_workers_test_util, [unique_type/1]).

-export([set_sink/1]).

-define(SINK, couch_workers_test_telemetry_sink).

telemetry_test_() ->
    {
        "telemetry events",
        {
            setup,
            fun couch_workers_test_util:start_app/0,
            fun(Ctx) ->
                unload_stand_in(),
                couch_workers_test_util:stop_app(Ctx)
            end,
            fun(_) ->
                [
                    {"job and worker events with measurements and metadata", ?_test(events_when_loaded())},
                    {"no event while telemetry is not loaded", ?_test(no_events_when_absent())}
                ]
            end
        }
    }.

set_sink(Pid) ->
    persistent_term:put(?SINK, Pid).

events_when_loaded() ->
    {module, telemetry} = code:ensure_loaded(telemetry),
    set_sink(self()),
    T = unique_type("tel"),
    Node = node(),
    W = couch_workers:worker_register(T, <<"w1">>, #{}, self()),
    ?assertMatch(
        {#{system_time := _, count := 1}, #{type := T, id := <<"w1">>, node := Node}}, recv([couch_workers, worker, registered])
    ),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    {#{duration := D, count := 1}, #{type := T, id := <<"j1">>, node := Node}} = recv([couch_workers, job, added]),
    ?assert(is_integer(D) andalso D > 0),
    ok = couch_workers:job_add_many(T, [{<<"j2">>, #{}, #{}}, {<<"j3">>, #{}, #{}}]),
    ?assertMatch({#{count := 2}, #{type := T, ids := [<<"j2">>, <<"j3">>]}}, recv([couch_workers, job, added])),
    {ok, J} = couch_workers:job_accept(W, #{}),
    ?assertMatch({#{duration := _}, #{type := T, id := <<"j1">>}}, recv([couch_workers, job, accepted])),
    ok = couch_workers:job_finish(J, #{}),
    ?assertMatch({#{duration := _}, #{type := T, id := <<"j1">>}}, recv([couch_workers, job, finished])),
    ok = couch_workers:job_cancel(T, <<"j2">>),
    ?assertMatch({_, #{type := T, id := <<"j2">>}}, recv([couch_workers, job, canceled])),
    ok = couch_workers:job_remove(T, <<"j3">>),
    ?assertMatch({_, #{type := T, id := <<"j3">>}}, recv([couch_workers, job, removed])),
    %% A failed call emits nothing.
    {error, already_exists} = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:worker_unregister(W),
    ?assertMatch({_, #{type := T, id := <<"w1">>}}, recv([couch_workers, worker, unregistered])),
    ?assertEqual([], drain()).

no_events_when_absent() ->
    unload_stand_in(),
    set_sink(self()),
    T = unique_type("tel_off"),
    ok = couch_workers:job_add(T, <<"j1">>, #{}, #{}),
    ok = couch_workers:job_remove(T, <<"j1">>),
    ?assertEqual(false, erlang:module_loaded(telemetry)),
    ?assertEqual([], drain()),
    %% Counting goes on.
    #{T := #{jobs_added := 1, jobs_removed := 1}} = maps:get(types, couch_workers:metrics()).

recv(Event) ->
    receive
        {telemetry, Event, Measurements, Metadata} -> {Measurements, Metadata}
    after 5000 -> erlang:error({no_event, Event, drain()})
    end.

drain() ->
    receive
        {telemetry, _, _, _} = E -> [E | drain()]
    after 200 -> []
    end.

unload_stand_in() ->
    _ = persistent_term:erase(?SINK),
    _ = code:purge(telemetry),
    _ = code:delete(telemetry),
    _ = code:purge(telemetry),
    ok.
