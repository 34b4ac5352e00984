%% @doc The status page's HTML, from `couch_workers_status:collect/1':
%% one self-contained page (inline CSS and SVG, no script), refreshing
%% itself every `?REFRESH_S' seconds.
%%
%% Per worker type: its live workers, each with a bar of its heartbeat
%% age against its timeout (green under a third, where heartbeats renew;
%% amber under two thirds; red beyond: close to being reaped), its running
%% jobs and options. Per job type: its counts by state (running beside
%% its `max_running', when it has one), its settings, a chart of the
%% jobs this node finished per sample interval, its latest failed jobs
%% with their errors and its paused flag (each shown as "n/a" when its
%% read failed). Each worker type's leader, and each job type's schedules
%% with their next and last run. Every id, type and option is HTML-escaped; bytes that are not
%% UTF-8 are shown as `\xNN'.
-module(couch_workers_status_page).

-export([render/1, escape/1]).

-define(REFRESH_S, 5).

-spec render(map()) -> iodata().
render(#{node := Node, worker_types := WTs, job_types := JTs}) ->
    [
        <<"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">">>,
        <<"<meta http-equiv=\"refresh\" content=\"">>, integer_to_binary(?REFRESH_S), <<"\">">>,
        <<"<title>couch_workers</title><style>">>, css(), <<"</style></head><body>">>,
        <<"<header><h1>couch_workers</h1><span class=\"node\">node ">>, escape(atom_to_binary(Node)),
        <<" &middot; refreshed every ">>, integer_to_binary(?REFRESH_S), <<" s &middot; ">>,
        <<"<a href=\"/metrics\">/metrics</a> &middot; <a href=\"/api/status\">/api/status</a></span></header>">>,
        <<"<h2>Workers</h2>">>,
        case WTs of
            [] -> <<"<p class=\"none\">No registered workers.</p>">>;
            _ -> [worker_type(W) || W <- WTs]
        end,
        <<"<h2>Jobs</h2>">>,
        case JTs of
            [] -> <<"<p class=\"none\">No job types known.</p>">>;
            _ -> job_table(JTs)
        end,
        <<"<h2>Schedules</h2>">>,
        schedule_table(JTs),
        <<"</body></html>\n">>
    ].

css() ->
    <<"body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}"
      "header{display:flex;align-items:baseline;gap:1em}h1{margin:0;font-size:1.5em}"
      ".node{color:#666}h2{margin-top:1.5em;border-bottom:1px solid #ddd}"
      "h3{margin:1em 0 .3em}table{border-collapse:collapse;background:#fff;min-width:40em}"
      "td,th{padding:.25em .7em;border-bottom:1px solid #eee;text-align:left;vertical-align:middle}"
      "th{background:#f0f0f0;font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums}"
      ".bar{width:12em;height:.8em;background:#eee;border-radius:.4em;overflow:hidden;display:inline-block;vertical-align:middle}"
      ".bar span{display:block;height:100%}.ok{background:#3a3}.warn{background:#e90}.late{background:#d33}"
      ".opts{color:#555;font-family:monospace;font-size:12px}.none{color:#888}"
      ".paused{color:#d33;font-weight:600}.fail{color:#a00;font-family:monospace;font-size:12px}"
      "svg{vertical-align:middle}">>.

%% ---- workers ---------------------------------------------------------------------

worker_type(#{type := T, total := Total, workers := Workers} = WT) ->
    [
        <<"<h3>">>, escape(T), <<" <span class=\"none\">(">>, integer_to_binary(Total),
        <<" live; leader ">>, leader(maps:get(leader, WT, unknown)), <<")</span></h3><table><tr><th>worker</th><th>heartbeat age</th><th></th>"
          "<th class=\"num\">timeout</th><th class=\"num\">running</th><th>options</th></tr>">>,
        [worker_row(W) || W <- Workers],
        case Total > length(Workers) of
            true -> [<<"<tr><td colspan=\"6\" class=\"none\">and ">>, integer_to_binary(Total - length(Workers)), <<" more</td></tr>">>];
            false -> <<>>
        end,
        <<"</table>">>
    ].

worker_row(#{id := Id, opts := Opts, timeout := Timeout, heartbeat_age_ms := Age, running := Running}) ->
    [
        <<"<tr><td>">>, escape(Id), <<"</td><td>">>, age_bar(Age, Timeout), <<"</td><td class=\"num\">">>,
        age_text(Age), <<"</td><td class=\"num\">">>, timeout_text(Timeout), <<"</td><td class=\"num\">">>,
        integer_to_binary(Running), <<"</td><td class=\"opts\">">>,
        escape(iolist_to_binary(couch_workers_json:encode(Opts))), <<"</td></tr>">>
    ].

leader(Id) when is_binary(Id) -> [<<"<b>">>, escape(Id), <<"</b>">>];
leader(null) -> <<"none">>;
leader(_) -> <<"n/a">>.

age_bar(Age, Timeout) when is_integer(Age), is_integer(Timeout), Timeout > 0 ->
    Share = Age / (Timeout * 1000),
    Class =
        if
            Share < 1 / 3 -> <<"ok">>;
            Share < 2 / 3 -> <<"warn">>;
            true -> <<"late">>
        end,
    Pct = integer_to_binary(round(min(1.0, Share) * 100)),
    [<<"<span class=\"bar\" title=\"share of the timeout\"><span class=\"">>, Class, <<"\" style=\"width:">>, Pct, <<"%\"></span></span>">>];
age_bar(_Age, _Timeout) ->
    <<"<span class=\"none\">no health record</span>">>.

age_text(Age) when is_integer(Age) -> [float_to_binary(Age / 1000, [{decimals, 1}]), <<" s">>];
age_text(_) -> <<"&ndash;">>.

timeout_text(T) when is_integer(T) -> [integer_to_binary(T), <<" s">>];
timeout_text(_) -> <<"&ndash;">>.

%% ---- schedules -------------------------------------------------------------------

schedule_table(JTs) ->
    Rows = [schedule_row(T, S) || #{type := T, schedules := L} <- JTs, is_list(L), S <- L],
    Unknown = [T || #{type := T, schedules := unknown} <- JTs],
    [
        case Rows of
            [] -> <<"<p class=\"none\">No schedules of the job types above.</p>">>;
            _ -> [<<"<table><tr><th>job type</th><th>schedule</th><th>spec</th><th>next run (UTC)</th><th>last run</th></tr>">>, Rows, <<"</table>">>]
        end,
        [[<<"<p class=\"none\">Schedules of ">>, escape(T), <<": n/a</p>">>] || T <- Unknown]
    ].

schedule_row(T, #{id := Id, spec := Spec, next_run_at := Next, last_run := Last}) ->
    [
        <<"<tr><td>">>, escape(T), <<"</td><td>">>, escape(Id), <<"</td><td class=\"opts\">">>,
        escape(iolist_to_binary(couch_workers_json:encode(Spec))), <<"</td><td>">>, utc(Next), <<"</td><td>">>,
        case Last of
            null -> <<"<span class=\"none\">none yet</span>">>;
            _ -> escape(Last)
        end,
        <<"</td></tr>">>
    ].

utc(Ms) when is_integer(Ms) ->
    escape(list_to_binary(calendar:system_time_to_rfc3339(Ms, [{unit, millisecond}, {offset, "Z"}])));
utc(_) ->
    <<"n/a">>.

%% ---- jobs ------------------------------------------------------------------------

-define(STATES, [scheduled, pending, running, finished, canceled, failed]).

job_table(JTs) ->
    [
        <<"<table><tr><th>job type</th>">>,
        [[<<"<th class=\"num\">">>, atom_to_binary(S), <<"</th>">>] || S <- ?STATES],
        <<"<th>limits</th><th>finished on this node (last 10 min)</th><th>paused</th><th>failed jobs</th></tr>">>,
        [job_row(J) || J <- JTs],
        <<"</table>">>
    ].

job_row(#{type := T, counts := Counts, throughput := Samples, paused := Paused, failures := Failures} = J) ->
    Settings = maps:get(settings, J, #{}),
    [
        <<"<tr><td>">>, escape(T), <<"</td>">>,
        [[<<"<td class=\"num\">">>, state_count(S, Counts, Settings), <<"</td>">>] || S <- ?STATES],
        <<"<td>">>, limits(Settings), <<"</td>">>,
        <<"<td>">>, chart(Samples), <<"</td><td>">>, paused(Paused), <<"</td><td>">>, failures(T, Failures), <<"</td></tr>">>
    ].

%% The running count beside the type's `max_running', when it has one.
state_count(running, Counts, #{max_running := Max}) when is_integer(Max) ->
    [count(maps:get(running, Counts, undefined)), <<" / ">>, integer_to_binary(Max)];
state_count(S, Counts, _Settings) ->
    count(maps:get(S, Counts, undefined)).

%% The type's settings that are not their default.
limits(Settings) when map_size(Settings) =:= 0 ->
    <<"<span class=\"none\">n/a</span>">>;
limits(Settings) ->
    Set = [
        [Label, integer_to_binary(V), Unit]
     || {Key, Label, Unit} <- [
            {max_running, <<"max running ">>, <<>>},
            {max_running_per_group, <<"per group ">>, <<>>},
            {activity_timeout, <<"activity timeout ">>, <<" s">>}
        ],
        V <- [maps:get(Key, Settings, infinity)],
        is_integer(V)
    ],
    case Set of
        [] -> <<"<span class=\"none\">none</span>">>;
        _ -> lists:join(<<", ">>, Set)
    end.

count(N) when is_integer(N) -> integer_to_binary(N);
count(_) -> <<"<span class=\"none\">n/a</span>">>.

paused(true) -> <<"<span class=\"paused\">paused</span>">>;
paused(false) -> <<"no">>;
paused(_) -> <<"<span class=\"none\">n/a</span>">>.

failures(_T, #{jobs := [], complete := true}) ->
    <<"<span class=\"none\">none</span>">>;
failures(T, #{jobs := Jobs, complete := Complete}) ->
    [
        [
            %% Each with a link to the job's page, which shows its last runs.
            [<<"<div class=\"fail\">">>, escape(Id), <<": ">>, escape(iolist_to_binary(couch_workers_json:encode(maps:get(error, J, null)))),
             <<" <a href=\"">>, escape(couch_workers_job_page:path(T, Id)), <<"\">runs</a></div>">>]
         || #{id := Id} = J <- Jobs
        ],
        case Complete of
            true -> <<>>;
            false -> <<"<div class=\"none\">latest among the first failed jobs by id</div>">>
        end
    ];
failures(_T, _Unknown) ->
    <<"<span class=\"none\">n/a</span>">>.

%% A bar per sample interval: the jobs finished since the sample before.
chart(Samples) when length(Samples) < 2 ->
    <<"<span class=\"none\">collecting&hellip;</span>">>;
chart(Samples) ->
    Finished = [F || {_, F, _} <- Samples],
    Deltas = [max(0, B - A) || {A, B} <- lists:zip(lists:droplast(Finished), tl(Finished))],
    Max = max(1, lists:max(Deltas)),
    W = 6,
    H = 28,
    Bars = [
        begin
            BH = max(1, round(D / Max * H)),
            io_lib:format("<rect x=\"~b\" y=\"~b\" width=\"~b\" height=\"~b\" fill=\"~s\"/>", [
                I * W, H - BH, W - 1, BH, case D of 0 -> "#ddd"; _ -> "#37c" end
            ])
        end
     || {I, D} <- lists:zip(lists:seq(0, length(Deltas) - 1), Deltas)
    ],
    [
        io_lib:format("<svg width=\"~b\" height=\"~b\" role=\"img\"><title>max ~b per interval</title>", [length(Deltas) * W, H, Max]),
        Bars,
        <<"</svg> ">>,
        integer_to_binary(lists:last(Deltas)),
        <<" in the last interval">>
    ].

%% @doc HTML-escapes a binary; bytes that are not UTF-8 show as `\xNN'.
-spec escape(binary()) -> iodata().
escape(Bin) ->
    Chars =
        case unicode:characters_to_list(Bin) of
            L when is_list(L) -> L;
            _ -> lists:flatten([byte_text(B) || <<B>> <= Bin])
        end,
    unicode:characters_to_binary([html_char(C) || C <- Chars]).

byte_text(B) when B >= 16#80 -> io_lib:format("\\x~2.16.0b", [B]);
byte_text(B) -> [B].

html_char($<) -> "&lt;";
html_char($>) -> "&gt;";
html_char($&) -> "&amp;";
html_char($") -> "&quot;";
html_char($') -> "&#39;";
html_char(C) -> C.
