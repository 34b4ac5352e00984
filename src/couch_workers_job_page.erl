%% @doc The status page's page of one job (`GET /job/Type/Id'): its
%% state, attempts, worker and error, and its last runs, newest first
%% (the `history' of `couch_workers:job_get/2'). Every id, type and value
%% is HTML-escaped (`couch_workers_status_page:escape/1').
-module(couch_workers_job_page).

-export([render/1, path/2]).

%% @doc The page of a job as `job_get/2' gives it.
-spec render(couch_workers:job()) -> iodata().
render(#{type := T, id := Id, state := State, attempts := Attempts, worker := Worker, error := Error} = Job) ->
    Runs = maps:get(history, Job, []),
    [
        <<"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>couch_workers job</title>">>,
        <<"<style>body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}"
          "table{border-collapse:collapse}td,th{padding:.25em .7em;border-bottom:1px solid #eee;text-align:left}"
          "th{background:#f0f0f0}.mono{font-family:monospace;font-size:12px}.none{color:#888}</style></head><body>">>,
        <<"<p><a href=\"/\">&larr; status</a></p><h1>">>, esc(T), <<" / ">>, esc(Id), <<"</h1>">>,
        <<"<p>state <b>">>, atom_to_binary(State), <<"</b> &middot; attempts ">>, integer_to_binary(Attempts),
        <<" &middot; worker ">>, value(Worker), <<" &middot; error <span class=\"mono\">">>, json(Error), <<"</span></p>">>,
        <<"<h2>Last runs</h2>">>,
        case Runs of
            [] ->
                <<"<p class=\"none\">No run yet.</p>">>;
            _ ->
                [
                    <<"<table><tr><th>run</th><th>worker</th><th>started (UTC)</th><th>ended (UTC)</th>"
                      "<th>outcome</th><th>error</th></tr>">>,
                    [run(R) || R <- Runs],
                    <<"</table>">>
                ]
        end,
        <<"</body></html>\n">>
    ].

%% @doc The page's path for a job: `/job/Type/Id', each percent-encoded
%% byte by byte (ids are any bytes, not always UTF-8).
-spec path(binary(), binary()) -> binary().
path(Type, Id) ->
    iolist_to_binary([<<"/job/">>, pct(Type), <<"/">>, pct(Id)]).

pct(Bin) ->
    [
        case C of
            _ when C >= $a, C =< $z; C >= $A, C =< $Z; C >= $0, C =< $9; C =:= $-; C =:= $_; C =:= $.; C =:= $~ -> C;
            _ -> io_lib:format("%~2.16.0B", [C])
        end
     || <<C>> <= Bin
    ].

run(#{attempt := A, worker := W, started_at := S, ended_at := E, outcome := O, error := Err}) ->
    [
        <<"<tr><td>">>, integer_to_binary(A), <<"</td><td>">>, esc(W), <<"</td><td>">>, time(S),
        <<"</td><td>">>, time(E), <<"</td><td>">>, atom_to_binary(O), <<"</td><td class=\"mono\">">>, json(Err),
        <<"</td></tr>">>
    ].

time(null) -> <<"<span class=\"none\">-</span>">>;
time(Ms) -> list_to_binary(calendar:system_time_to_rfc3339(Ms, [{unit, millisecond}, {offset, "Z"}])).

value(null) -> <<"<span class=\"none\">-</span>">>;
value(Bin) -> esc(Bin).

json(null) -> <<"<span class=\"none\">-</span>">>;
json(Map) -> esc(iolist_to_binary(couch_workers_json:encode(Map))).

esc(Bin) -> couch_workers_status_page:escape(Bin).
