%% @doc A stand-in for the `telemetry' application's module (not
%% installable here: not in Debian, hex.pm unreachable), for
%% couch_workers_telemetry_tests. Only `execute/3', which couch_workers
%% calls: each event goes as `{telemetry, Event, Measurements, Metadata}'
%% to the pid set with `couch_workers_telemetry_tests:set_sink/1', if any.
%% couch_workers emits only while this module is loaded, as it would with
%% the real one.
-module(telemetry).

-export([execute/3]).

-spec execute([atom()], map(), map()) -> ok.
execute(Event, Measurements, Metadata) when is_list(Event), is_map(Measurements), is_map(Metadata) ->
    case persistent_term:get(couch_workers_test_telemetry_sink, undefined) of
        Pid when is_pid(Pid) -> Pid ! {telemetry, Event, Measurements, Metadata};
        _ -> ok
    end,
    ok.
