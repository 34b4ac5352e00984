#!/usr/bin/env escript
%% -*- erlang -*-
%%! -noshell
%% The checks of the app, on Erlang modules that are not part of it (the
%% bench modules, bench/src, and the soak modules, scripts/soak), with the
%% app's own settings from rebar.config: compiled with its erl_opts
%% (warn_missing_spec included: every export keeps its -spec), analysed
%% by dialyzer with the warnings of its `dialyzer' entry and the PLT
%% `rebar3 dialyzer' built, and by xref with its xref_checks and
%% xref_ignores (and the modules' -ignore_xref attributes).
%% scripts/check-erlang.sh runs it after `rebar3 dialyzer' and
%% `rebar3 xref' passed on the app.
%%
%% escript scripts/check_erlang.escript REBAR_CONFIG PLT APP_EBIN OUT_DIR SRC_DIR...
%%
%% Each SRC_DIR's *.erl is compiled into a directory of its own under
%% OUT_DIR. Dialyzer analyses these modules together with the app's
%% (APP_EBIN, compiled by rebar3), whose types their calls need; xref
%% resolves their calls against the app and OTP (the library path).
%% Every warning is printed; the last line says how many of each kind;
%% the exit status is 1 when there was any (2: the check could not run).
-mode(compile).

main([RebarConfig, Plt, AppEbin, OutDir | SrcDirs]) when SrcDirs =/= [] ->
    {ok, Config} = file:consult(RebarConfig),
    {BeamDirs, C} = lists:unzip([compile_dir(Config, Src, OutDir) || Src <- SrcDirs]),
    Beams = lists:append([beams(D) || D <- BeamDirs]),
    Mods = [{list_to_atom(filename:basename(B, ".beam")), B} || B <- Beams],
    io:format("check_erlang: ~b modules (~s), with the app's (~s)~n", [length(Mods), lists:join(", ", SrcDirs), AppEbin]),
    D = dialyzer(Config, Plt, Beams ++ beams(AppEbin)),
    X = xref(Config, AppEbin, BeamDirs, Mods),
    report(lists:append(C) ++ D ++ X);
main(_) ->
    io:format(standard_error, "usage: check_erlang.escript REBAR_CONFIG PLT APP_EBIN OUT_DIR SRC_DIR...~n", []),
    halt(2).

%% {BeamDir, [{Kind, Text}]}: the compiler's warnings (an error stops the
%% check).
compile_dir(Config, Src, OutDir) ->
    Out = filename:join(OutDir, re:replace(Src, "[/.]+", "_", [global, {return, list}])),
    ok = filelib:ensure_dir(filename:join(Out, "x")),
    Opts = [debug_info, return_errors, return_warnings, {outdir, Out} | proplists:get_value(erl_opts, Config, [])],
    Files = filelib:wildcard(filename:join(Src, "*.erl")),
    Files =/= [] orelse fail("no .erl files in ~s", [Src]),
    Warnings = lists:append([compile_file(F, Opts) || F <- Files]),
    {Out, Warnings}.

compile_file(File, Opts) ->
    case compile:file(File, Opts) of
        {ok, _Mod, Ws} ->
            [
                {{compile, warning}, io_lib:format("~ts:~s: Warning: ~ts~n", [F, location(Loc), M:format_error(D)])}
             || {F, Items} <- Ws, {Loc, M, D} <- Items
            ];
        {error, Es, _Ws} ->
            [
                io:format(standard_error, "~ts:~s: ~ts~n", [F, location(Loc), M:format_error(D)])
             || {F, Items} <- Es, {Loc, M, D} <- Items
            ],
            fail("~ts does not compile", [File])
    end.

location({Line, Col}) -> io_lib:format("~b:~b", [Line, Col]);
location(Line) when is_integer(Line) -> integer_to_list(Line);
location(none) -> "".

beams(Dir) ->
    case filelib:wildcard(filename:join(Dir, "*.beam")) of
        [] -> fail("no .beam files in ~s", [Dir]);
        Beams -> Beams
    end.

%% [{Kind, Text}] for every warning.
dialyzer(Config, Plt, Beams) ->
    Opts = proplists:get_value(dialyzer, Config, []),
    Warnings = proplists:get_value(warnings, Opts, []),
    io:format("check_erlang: dialyzer (warnings: defaults + ~w; PLT ~s) on ~b modules~n", [Warnings, Plt, length(Beams)]),
    Found =
        try
            dialyzer:run([
                {analysis_type, succ_typings},
                {plts, [Plt]},
                {check_plt, false},
                {files, Beams},
                {from, byte_code},
                {warnings, Warnings}
            ])
        catch
            throw:{dialyzer_error, Msg} -> fail("dialyzer: ~ts", [Msg])
        end,
    [{{dialyzer, Tag}, dialyzer:format_warning(W, [{filename_opt, fullpath}])} || {Tag, _, _} = W <- Found].

%% [{Kind, Text}] for every xref finding not ignored.
xref(Config, AppEbin, BeamDirs, Mods) ->
    Checks = proplists:get_value(xref_checks, Config, []),
    Ignores = proplists:get_value(xref_ignores, Config, []),
    io:format("check_erlang: xref ~w~n", [Checks]),
    {ok, X} = xref:start([{xref_mode, functions}]),
    ok = xref:set_default(X, [{warnings, false}, {verbose, false}]),
    ok = xref:set_library_path(X, [AppEbin | code:get_path()]),
    [{ok, _} = xref:add_directory(X, Dir) || Dir <- BeamDirs],
    Found = lists:append([xref_check(X, Check, Ignores, Mods) || Check <- Checks]),
    xref:stop(X),
    Found.

xref_check(X, Check, Ignores, Mods) ->
    {ok, Results} = xref:analyze(X, Check),
    [{{xref, Check}, xref_text(Check, R)} || R <- Results, not ignored(R, Ignores, Mods)].

%% rebar3's rule: a finding is skipped when its target (the function of
%% the call, or the function itself) is in xref_ignores or in an
%% -ignore_xref attribute of the module of the finding's source.
ignored(Result, Ignores, Mods) ->
    {Source, Target} =
        case Result of
            {S, T} -> {S, T};
            MFA -> {MFA, MFA}
        end,
    SourceMod = element(1, Source),
    Attr =
        case lists:keyfind(SourceMod, 1, Mods) of
            {_, Beam} -> ignore_xref(Beam);
            false -> []
        end,
    lists:any(
        fun
            ({M, F, A}) -> {M, F, A} =:= Target;
            (M) when is_atom(M) -> M =:= element(1, Target);
            (_) -> false
        end,
        Ignores ++ Attr
    ).

ignore_xref(Beam) ->
    {ok, {_, [{attributes, Attrs}]}} = beam_lib:chunks(Beam, [attributes]),
    lists:append([
        if
            is_list(V) -> V;
            true -> [V]
        end
     || {ignore_xref, V} <- Attrs
    ]).

xref_text(Check, {{M, F, A}, {TM, TF, TA}}) ->
    io_lib:format("~s: ~w:~w/~b calls ~w:~w/~b~n", [Check, M, F, A, TM, TF, TA]);
xref_text(Check, {M, F, A}) ->
    io_lib:format("~s: ~w:~w/~b~n", [Check, M, F, A]).

report(Found) ->
    [io:format("~ts", [Text]) || {_, Text} <- Found],
    Kinds = lists:foldl(fun({K, _}, Acc) -> maps:update_with(K, fun(N) -> N + 1 end, 1, Acc) end, #{}, Found),
    io:format("check_erlang: ~b warnings~ts~n", [
        length(Found),
        [io_lib:format(", ~w ~w: ~b", [Tool, Kind, N]) || {{Tool, Kind}, N} <- lists:sort(maps:to_list(Kinds))]
    ]),
    halt(
        case Found of
            [] -> 0;
            _ -> 1
        end
    ).

fail(Fmt, Args) ->
    io:format(standard_error, "check_erlang: " ++ Fmt ++ "~n", Args),
    halt(2).
