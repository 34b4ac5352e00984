%% @doc Events for `telemetry' handlers, where the `telemetry'
%% application is loaded: a soft dependency, resolved at run time (it is
%% not in Debian and hex.pm is not reachable here, so couch_workers
%% neither lists nor needs it).
%%
%% Each counted event is `telemetry:execute([couch_workers, Object,
%% Action], Measurements, Metadata)'; the README lists them. Where the
%% module `telemetry' is not loaded, `execute/3' is one BIF call
%% (`erlang:module_loaded/1') and nothing else: no lookup, no message.
%% A handler that crashes is telemetry's business (it detaches it); any
%% other error of the call is caught here, so that an event never fails
%% the API call it reports.
-module(couch_workers_telemetry).

-export([execute/3]).

%% `telemetry' is a soft dependency, absent from the build: rebar.config's
%% xref_ignores names its one call, below (the only call of couch_workers
%% to it), so that xref does not report it as undefined.

-include_lib("kernel/include/logger.hrl").

-spec execute([atom(), ...], map(), map()) -> ok.
execute(Event, Measurements, Metadata) ->
    case erlang:module_loaded(telemetry) of
        false ->
            ok;
        true ->
            try
                telemetry:execute(Event, Measurements, Metadata#{node => node()})
            catch
                Class:Reason ->
                    ?LOG_DEBUG(#{what => telemetry_execute_failed, event => Event, class => Class, reason => Reason}),
                    ok
            end,
            ok
    end.
