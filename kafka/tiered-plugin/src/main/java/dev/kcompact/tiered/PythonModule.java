package dev.kcompact.tiered;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * How the plugin starts kcompact's Python side: {@code <python> -m <module> --store <store> [--endpoint-url <url>]
 * <args>}, its stderr the broker's, and what to say when it is gone.
 */
final class PythonModule {

    private PythonModule() {
    }

    static Process start(String python, String module, String store, String endpointUrl, String... args)
            throws IOException {
        List<String> command = new ArrayList<>(List.of(python, "-m", module, "--store", store));
        if (endpointUrl != null) {
            command.addAll(List.of("--endpoint-url", endpointUrl));
        }
        command.addAll(List.of(args));
        return new ProcessBuilder(command).redirectError(ProcessBuilder.Redirect.INHERIT).start();
    }

    /** "exited with N (...)" once it has, else "closed its pipe": its pipe closes just before it exits, so the exit
     * is given a moment, to name its code. */
    static String gone(Process process) {
        try {
            process.waitFor(2, TimeUnit.SECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        return process.isAlive() ? "closed its pipe"
                : "exited with " + process.exitValue() + " (its stderr is the broker's)";
    }
}
